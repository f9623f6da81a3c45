"""``--api-key``: requests to ``/v1`` must send ``Authorization: Bearer <key>``, else HTTP 401
(as vLLM; ``/health``, ``/version`` and ``/metrics`` stay open). CORS preflight requests pass."""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from guidedec.server.protocol import error_body


class ApiKeyAuth:
    """ASGI middleware checking the bearer token of ``/v1`` requests."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("the API key must not be empty")
        self.app, self._expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = (
            scope["type"] == "http"
            and str(scope.get("path", "")).startswith(("/v1", "/tokenize", "/detokenize"))
            and scope.get("method") != "OPTIONS"
        )
        if guarded:
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await _unauthorized(send)
                return
        await self.app(scope, receive, send)


async def _unauthorized(send: Send) -> None:
    body = json.dumps(
        error_body("Unauthorized: a valid API key is required", kind="Unauthorized", code=401)
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
