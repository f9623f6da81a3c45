"""The server's errors and their HTTP answers: OpenAI error objects, with vLLM's codes.

A request the server refuses (a malformed body, a field of the wrong type, an option guidedec
does not implement, a guide that does not compile) gets HTTP 400 naming the problem, an unknown
model 404; the server keeps serving. Refusals of ``/v1`` requests are counted in the metrics.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from guidedec.server.choices import ClientGoneError, ShuttingDownError
from guidedec.server.metrics import ServerMetrics
from guidedec.server.protocol import error_body


class BadRequestError(ValueError):
    """HTTP 400: the message names the problem, :attr:`param` the request's field (its path,
    e.g. ``"response_format.json_schema.schema"``), or None."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param: str | None = param


class ModelNotFoundError(LookupError):
    """HTTP 404: the request names a model the server does not serve."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.")


def add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Answer each of the server's errors as above; FastAPI's own (a body that does not
    validate, an unknown route) as OpenAI error objects too."""
    app.add_exception_handler(RequestValidationError, _invalid(metrics))
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(ClientGoneError, _gone)
    app.add_exception_handler(ShuttingDownError, _shutting_down)
    app.add_exception_handler(BadRequestError, _bad(metrics))
    app.add_exception_handler(ModelNotFoundError, _no_model(metrics))


def _invalid(metrics: ServerMetrics) -> Any:
    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            message = f"the request body is not valid JSON: {first.get('msg', '')}"
            position = first.get("loc", ())[1:]
            if position:
                message += f" (at character {position[0]})"
            return _rejected(metrics, request, error_body(message), 400)
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = f"{param or 'body'}: {first.get('msg', 'invalid request')}"
        return _rejected(metrics, request, error_body(message, param=param), 400)

    return invalid


def _bad(metrics: ServerMetrics) -> Any:
    async def bad(request: Request, exc: Exception) -> JSONResponse:
        param = getattr(exc, "param", None)
        return _rejected(metrics, request, error_body(str(exc), param=param), 400)

    return bad


def _no_model(metrics: ServerMetrics) -> Any:
    async def no_model(request: Request, exc: Exception) -> JSONResponse:
        body = error_body(str(exc), param="model", kind="NotFoundError", code=404)
        return _rejected(metrics, request, body, 404)

    return no_model


async def _http(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kinds = {404: "NotFoundError", 405: "MethodNotAllowedError"}
    body = error_body(
        str(exc.detail), kind=kinds.get(exc.status_code, "HTTPError"), code=exc.status_code
    )
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _gone(_: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it: the client closed the connection


async def _shutting_down(_: Request, exc: Exception) -> JSONResponse:
    body = error_body("the server is shutting down", kind="service_unavailable", code=503)
    return JSONResponse(body, status_code=503)


def _rejected(
    metrics: ServerMetrics, request: Request, body: dict[str, Any], status: int
) -> JSONResponse:
    if request.url.path.startswith("/v1/") and request.method == "POST":
        metrics.record_rejected()
    return JSONResponse(body, status_code=status)
