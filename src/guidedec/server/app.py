"""The OpenAI-compatible HTTP API: ``/health``, ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``, with server-sent events when ``stream`` is true.

Bad input (a malformed body, a field of the wrong type, a guide that does not compile, a prompt
longer than the model's context) gets HTTP 400 with an OpenAI error object naming the problem;
the server keeps serving. A client that disconnects mid-stream aborts its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from guidedec.engine import LLM, RequestOutput, SamplingParams
from guidedec.engine.prompts import Prompt, check_prompt, tokenize
from guidedec.errors import GuidedecError
from guidedec.grammar.isolation import lower_priority
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.server.async_engine import AsyncEngine
from guidedec.server.chat import render_chat
from guidedec.server.limits import DEFAULT_MAX_REQUEST_BYTES, BodyLimit, too_long_to_fit
from guidedec.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    _Request,
    error_body,
)
from guidedec.server.stream import TextStream
from guidedec.server.structured import (
    RequestError,
    check_tools,
    guide_for_request,
    parse_tool_calls,
)

DEFAULT_COMPLETION_TOKENS = 16
DISCONNECT_POLL_S = 0.25
"""How often a non-streaming request checks that its client is still there."""
COMPILE_THREADS = 2
"""Guides the server compiles at once (each first probed in a compile worker, which bounds the
time and the queue)."""


class ClientGoneError(Exception):
    """The client of a non-streaming request went away before its output was ready."""


class ShuttingDownError(Exception):
    """A request still running when the server's graceful shutdown ran out (HTTP 503)."""


async def _abort(collecting: asyncio.Future[Any]) -> None:
    """Cancel a request's collection: that closes its engine stream, which aborts it."""
    collecting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await collecting


class BadRequestError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def create_app(
    llm: LLM,
    *,
    model_name: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    """An app serving ``llm``; its engine thread starts now and stops with the app. A request
    body past ``max_request_bytes`` gets HTTP 413."""
    engine = AsyncEngine(llm)
    name = model_name or llm.model.name

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.stop()

    app = FastAPI(title="guidedec", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    app.state.engine = engine
    _add_error_handlers(app)
    api = _Api(llm, engine, name)

    app.get("/health")(api.health)
    app.get("/v1/models")(api.models)
    app.post("/v1/completions", response_model=None)(api.completions)
    app.post("/v1/chat/completions", response_model=None)(api.chat_completions)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = f"{param or 'body'}: {first.get('msg', 'invalid request')}"
        return JSONResponse(error_body(message, param=param), status_code=400)

    async def bad(_: Request, exc: Exception) -> JSONResponse:
        param = getattr(exc, "param", None)
        return JSONResponse(error_body(str(exc), param=param), status_code=400)

    async def gone(_: Request, exc: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it: the client closed the connection

    app.add_exception_handler(RequestValidationError, invalid)

    async def shutting_down(_: Request, exc: Exception) -> JSONResponse:
        body = error_body("the server is shutting down", kind="service_unavailable")
        return JSONResponse(body, status_code=503)

    app.add_exception_handler(ClientGoneError, gone)
    app.add_exception_handler(ShuttingDownError, shutting_down)
    app.add_exception_handler(BadRequestError, bad)
    app.add_exception_handler(RequestError, bad)


class _Api:
    def __init__(self, llm: LLM, engine: AsyncEngine, name: str) -> None:
        self.llm, self.engine, self.name = llm, engine, name
        # The most characters one token covers: a prompt longer than that many per context
        # position is refused before it is tokenized.
        self._longest_token = max(len(t) for t in llm.tokenizer.hf_tokenizer.get_vocab())
        self._compiles = ThreadPoolExecutor(
            COMPILE_THREADS, thread_name_prefix="guidedec-serve-compile", initializer=lower_priority
        )

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "active_requests": self.engine.num_active}

    async def models(self) -> dict[str, Any]:
        card = {"id": self.name, "object": "model", "created": 0, "owned_by": "guidedec"}
        return {"object": "list", "data": [card]}

    async def completions(self, body: CompletionRequest, request: Request) -> Any:
        prompt: Prompt = body.prompt
        params = await self._params(body, prompt, body.max_tokens or DEFAULT_COMPLETION_TOKENS)
        shape = _Shape("cmpl", "text_completion", self.name)
        if body.stream:
            return _sse(self._stream_completion(prompt, params, shape))
        output = await self._collect(prompt, params, request)
        return shape.completion(output, self.llm)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Any:
        try:
            prompt = render_chat([m.model_dump() for m in body.messages], _hf(self.llm))
        except ValueError as exc:
            raise BadRequestError(str(exc), "messages") from exc
        tools = (body.tools, body.tool_choice) if _calls_tools(body) else None
        max_tokens = body.max_completion_tokens or body.max_tokens
        params = await self._params(body, prompt, max_tokens, tools=tools)
        if tools and body.tool_choice == "required" and not body.parallel_tool_calls:
            params = replace(params, guided_decoding=_one_call(params.guided_decoding))
        shape = _Shape("chatcmpl", "chat.completion", self.name)
        if body.stream:
            return _sse(self._stream_chat(prompt, params, shape, tools))
        output = await self._collect(prompt, params, request)
        return shape.chat(output, self.llm, tools)

    async def _params(
        self, body: _Request, prompt: Prompt, max_tokens: int | None, *, tools: Any = None
    ) -> SamplingParams:
        prompt_len = await asyncio.to_thread(self._check_prompt, prompt)
        room = self.llm.max_model_len - prompt_len
        max_tokens = room if max_tokens is None else max_tokens
        if max_tokens > room:
            raise BadRequestError(
                f"max_tokens={max_tokens} is more than the {room} tokens left in the model's "
                f"context of {self.llm.max_model_len} after the prompt's {prompt_len}",
                "max_tokens",
            )
        guide = guide_for_request(
            response_format=body.response_format,
            structured_outputs=body.structured_outputs,
            tools=tools[0] if tools else None,
            tool_choice=tools[1] if tools else None,
        )
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=body.top_k,
                seed=body.seed,
                stop_token_ids=body.stop_token_ids,
                guided_decoding=guide,
                close_within_budget=body.close_within_budget,
            )
        except ValueError as exc:  # the message starts with the field's name
            field = str(exc).split(" ", 1)[0]
            raise BadRequestError(str(exc), field if field in _SAMPLING_FIELDS else None) from exc
        if guide is not None:
            await self._compile(guide, _guide_param(body, tools))
        return params

    def _check_prompt(self, prompt: Prompt) -> int:
        if isinstance(prompt, str) and too_long_to_fit(
            prompt, self.llm.max_model_len, self._longest_token
        ):
            raise BadRequestError(
                f"the prompt's {len(prompt)} characters cannot fit the model's context of "
                f"{self.llm.max_model_len} tokens",
                "prompt",
            )
        try:
            tokenized = tokenize(prompt, self.llm.tokenizer)
            check_prompt(
                "the prompt", tokenized, self.llm.tokenizer.vocab_size, self.llm.max_model_len
            )
        except ValueError as exc:
            raise BadRequestError(str(exc), "prompt") from exc
        return len(tokenized.token_ids)

    async def _compile(self, guide: Any, param: str) -> None:
        """Compile on a compile thread (the event loop goes on, the compile at a lower priority
        than the engine's steps), warming the engine's cache."""
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._compiles, self.llm.factory.create, guide)
        except (GuidedecError, ValueError) as exc:
            raise BadRequestError(f"invalid guide: {exc}", param) from exc

    async def _collect(
        self, prompt: Prompt, params: SamplingParams, request: Request
    ) -> RequestOutput:
        """The request's output; a client that goes away before it is ready aborts it (its
        slot is freed, as for a streaming client that leaves)."""
        collecting = asyncio.ensure_future(self._output(prompt, params))
        try:
            while True:
                done, _ = await asyncio.wait({collecting}, timeout=DISCONNECT_POLL_S)
                if done:
                    return collecting.result()
                if await request.is_disconnected():
                    await _abort(collecting)
                    raise ClientGoneError
        except asyncio.CancelledError:  # the server's graceful shutdown ran out
            await _abort(collecting)
            raise ShuttingDownError from None

    async def _output(self, prompt: Prompt, params: SamplingParams) -> RequestOutput:
        async for delta in self.engine.generate(prompt, params):
            if delta.output is not None:
                return delta.output
        raise RuntimeError("the engine ended a request without an output")

    async def _stream_completion(
        self, prompt: Prompt, params: SamplingParams, shape: _Shape
    ) -> AsyncIterator[dict[str, Any]]:
        text = TextStream(self.llm.tokenizer)
        async for delta in self.engine.generate(prompt, params):
            piece = text.push(delta.token_ids, final=delta.output is not None)
            reason = None if delta.output is None else delta.output.finish_reason
            if piece or reason:
                yield shape.completion_chunk(piece, reason, delta.output)

    async def _stream_chat(
        self, prompt: Prompt, params: SamplingParams, shape: _Shape, tools: Any
    ) -> AsyncIterator[dict[str, Any]]:
        yield shape.chat_chunk({"role": "assistant", "content": ""}, None)
        text = TextStream(self.llm.tokenizer)
        async for delta in self.engine.generate(prompt, params):
            output = delta.output
            if output is not None and tools:
                message, why = _chat_message(output, self.llm, tools)
                yield shape.chat_chunk({k: v for k, v in message.items() if k != "role"}, why)
                return
            piece = text.push(delta.token_ids, final=output is not None)
            if not tools and (piece or output is not None):
                reason = None if output is None else _reason(output)
                yield shape.chat_chunk({"content": piece} if piece else {}, reason, output)


class _Shape:
    """Builds the response objects of one request (one id, one creation time)."""

    def __init__(self, prefix: str, kind: str, model: str) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind, self.model, self.created = kind, model, int(time.time())

    def _wrap(self, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, **choice}],
        }

    def completion(self, output: RequestOutput, llm: LLM) -> dict[str, Any]:
        choice = {"text": output.text, "logprobs": None, "finish_reason": _reason(output)}
        return {**self._wrap(self.kind, {**choice, **_error(output)}), "usage": _usage(output)}

    def completion_chunk(
        self, text: str, reason: str | None, output: RequestOutput | None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"text": text, "logprobs": None, "finish_reason": reason}
        if output is not None:
            choice = {**choice, "finish_reason": _reason(output), **_error(output)}
        return self._wrap(self.kind, choice)

    def chat(self, output: RequestOutput, llm: LLM, tools: Any) -> dict[str, Any]:
        message, reason = _chat_message(output, llm, tools)
        choice = {"message": message, "finish_reason": reason, **_error(output)}
        return {**self._wrap(self.kind, choice), "usage": _usage(output)}

    def chat_chunk(
        self, delta: dict[str, Any], reason: str | None, output: RequestOutput | None = None
    ) -> dict[str, Any]:
        choice = {"delta": delta, "finish_reason": reason, **(_error(output) if output else {})}
        return self._wrap("chat.completion.chunk", choice)


def _chat_message(output: RequestOutput, llm: LLM, tools: Any) -> tuple[dict[str, Any], str]:
    """The assistant message, with ``tool_calls`` when the request constrained it to tools."""
    if tools and output.finish_reason == "stop":
        try:
            calls = parse_tool_calls(output.text, tools=tools[0], tool_choice=tools[1])
        except ValueError:
            calls = None
        if calls:
            return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": output.text}, _reason(output)


def _one_call(guide: GuidedDecodingParams | None) -> GuidedDecodingParams:
    """The ``"required"`` tool-call guide (a JSON array of calls) limited to one call."""
    assert guide is not None and isinstance(guide.guide, str)
    return GuidedDecodingParams(json_schema={**json.loads(guide.guide), "maxItems": 1})


def _reason(output: RequestOutput) -> str:
    return output.finish_reason


def _error(output: RequestOutput) -> dict[str, Any]:
    """The choice's guidedec fields: ``error`` (a ``grammar_error``), ``incomplete`` (a guided
    output cut at its budget: why)."""
    extra: dict[str, Any] = {} if output.error is None else {"error": output.error}
    if output.incomplete is not None:
        extra["incomplete"] = output.incomplete
    return extra


def _usage(output: RequestOutput) -> dict[str, int]:
    prompt, completion = len(output.prompt_token_ids), len(output.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _calls_tools(body: ChatCompletionRequest) -> bool:
    """Whether the request's ``tool_choice`` asks for a call (with tools or without: the guide
    then says why it cannot be). Tools beside ``"auto"``/``"none"`` are checked all the same."""
    if body.tool_choice not in (None, "none", "auto"):
        return True
    if body.tools is not None:
        check_tools(body.tools)
    return False


_SAMPLING_FIELDS = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids"}
)


def _guide_param(body: _Request, tools: Any) -> str:
    if tools:
        return "tools"
    return "structured_outputs" if body.structured_outputs else "response_format"


def _hf(llm: LLM) -> Any:
    return llm.tokenizer.hf_tokenizer


def _sse(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


__all__ = ["BadRequestError", "create_app"]
