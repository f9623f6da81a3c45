"""The OpenAI-compatible HTTP API, with vLLM's names and shapes: ``/v1/completions``,
``/v1/chat/completions`` (server-sent events when ``stream`` is true), ``/v1/models``, and
``/health``, ``/version``, ``/metrics``, ``/tokenize``, ``/detokenize``.

Bad input (a malformed body, a field of the wrong type, an option guidedec does not implement, a
guide that does not compile, a prompt longer than the model's context) gets HTTP 400 with an
OpenAI error object naming the problem; an unknown model 404; the server keeps serving. A client
that disconnects aborts its request, streaming or not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

import guidedec
from guidedec.engine import LLM, RequestOutput, SamplingParams
from guidedec.engine.chat import render_chat
from guidedec.engine.prompts import Prompt, check_prompt, tokenize
from guidedec.errors import GuidedecError
from guidedec.grammar.isolation import lower_priority
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.server.async_engine import AsyncEngine
from guidedec.server.auth import ApiKeyAuth
from guidedec.server.choices import (
    Choice,
    ClientGoneError,
    ShuttingDownError,
    collect,
    expand,
    merged,
)
from guidedec.server.limits import DEFAULT_MAX_REQUEST_BYTES, BodyLimit, too_long_to_fit
from guidedec.server.metrics import CONTENT_TYPE, ServerMetrics
from guidedec.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    _Request,
    error_body,
)
from guidedec.server.reasoning_stream import ReasoningStream
from guidedec.server.responses import (
    Shape,
    chat_logprobs,
    completion_logprobs,
    guidedec_fields,
    usage,
)
from guidedec.server.stream import TextStream
from guidedec.server.structured import (
    RequestError,
    check_tools,
    guide_for_request,
)
from guidedec.server.tool_calls import ToolCalls, ToolSettings
from guidedec.server.tool_stream import ToolCallStream

DEFAULT_COMPLETION_TOKENS = 16
"""``max_tokens`` of a completion that gives none (OpenAI's and vLLM's default)."""
DEFAULT_CHAT_TOKENS = 256
"""``max_tokens`` of a chat completion that gives none (``--default-max-tokens``): a few
seconds of output on a CPU, where the context's room (vLLM's default) takes minutes."""
COMPILE_THREADS = 2
"""Guides the server compiles at once (each first probed in a compile worker, which bounds the
time and the queue)."""


class BadRequestError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFoundError(LookupError):
    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.")


def create_app(
    llm: LLM,
    *,
    model_name: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    default_max_tokens: int | None = DEFAULT_CHAT_TOKENS,
    api_key: str | None = None,
    allowed_origins: Sequence[str] = ("*",),
    allowed_methods: Sequence[str] = ("*",),
    allowed_headers: Sequence[str] = ("*",),
    allow_credentials: bool = False,
    chat_template: str | None = None,
    enable_auto_tool_choice: bool = False,
    tool_call_parser: str | None = None,
) -> FastAPI:
    """An app serving ``llm``; its engine thread starts now and stops with the app.

    Args:
        model_name: The model's id in the API (default: the model's name); requests naming
            another get 404.
        max_request_bytes: Larger request bodies get HTTP 413.
        default_max_tokens: ``max_tokens`` of a chat completion that gives none; None: all
            the room left in the context, as vLLM.
        api_key: When set, ``/v1`` requests must send ``Authorization: Bearer <api_key>``.
        allowed_origins, allowed_methods, allowed_headers, allow_credentials: CORS, as vLLM's
            flags of the same names (default: any origin).
        chat_template: The Jinja chat template of chat requests that give none (default: the
            model's own), as vLLM's ``--chat-template``.
        enable_auto_tool_choice: Serve ``tool_choice="auto"`` (vLLM's
            ``--enable-auto-tool-choice``): calls the model starts are guided and parsed.
        tool_call_parser: The tool-call format (vLLM's ``--tool-call-parser``: ``hermes``,
            ``llama3_json``, ``mistral``, ``pythonic``); default: the one the chat template
            teaches (see :mod:`guidedec.server.tool_calls`).

    Raises:
        ValueError: an unknown ``tool_call_parser``.
    """
    tool_settings = ToolSettings(
        enable_auto_tool_choice,
        tool_call_parser,
        close_objects=llm.disable_additional_properties,
    )
    engine = AsyncEngine(llm)
    name = model_name or llm.model.name

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.stop()

    app = FastAPI(title="guidedec", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    if api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=api_key)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(allowed_origins),
        allow_methods=list(allowed_methods),
        allow_headers=list(allowed_headers),
        allow_credentials=allow_credentials,
    )
    app.state.engine = engine
    api = _Api(llm, engine, name, default_max_tokens, chat_template, tool_settings)
    _add_error_handlers(app, api.metrics)

    app.get("/health")(api.health)
    app.get("/version")(api.version)
    app.get("/metrics")(api.prometheus)
    app.get("/v1/models")(api.models)
    app.post("/tokenize")(api.tokenize)
    app.post("/detokenize")(api.detokenize)
    app.post("/v1/completions", response_model=None)(api.completions)
    app.post("/v1/chat/completions", response_model=None)(api.chat_completions)
    return app


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
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

    async def bad(request: Request, exc: Exception) -> JSONResponse:
        param = getattr(exc, "param", None)
        return _rejected(metrics, request, error_body(str(exc), param=param), 400)

    async def no_model(request: Request, exc: Exception) -> JSONResponse:
        body = error_body(str(exc), param="model", kind="NotFoundError", code=404)
        return _rejected(metrics, request, body, 404)

    async def http(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kinds = {404: "NotFoundError", 405: "MethodNotAllowedError"}
        body = error_body(
            str(exc.detail), kind=kinds.get(exc.status_code, "HTTPError"), code=exc.status_code
        )
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def gone(_: Request, exc: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it: the client closed the connection

    async def shutting_down(_: Request, exc: Exception) -> JSONResponse:
        body = error_body("the server is shutting down", kind="service_unavailable", code=503)
        return JSONResponse(body, status_code=503)

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    app.add_exception_handler(ClientGoneError, gone)
    app.add_exception_handler(ShuttingDownError, shutting_down)
    app.add_exception_handler(BadRequestError, bad)
    app.add_exception_handler(RequestError, bad)
    app.add_exception_handler(ModelNotFoundError, no_model)


def _rejected(
    metrics: ServerMetrics, request: Request, body: dict[str, Any], status: int
) -> JSONResponse:
    if request.url.path.startswith("/v1/") and request.method == "POST":
        metrics.record_rejected()
    return JSONResponse(body, status_code=status)


class _Api:
    def __init__(
        self,
        llm: LLM,
        engine: AsyncEngine,
        name: str,
        default_max_tokens: int | None,
        chat_template: str | None,
        tool_settings: ToolSettings,
    ) -> None:
        self.llm, self.engine, self.name = llm, engine, name
        self.default_max_tokens, self.chat_template = default_max_tokens, chat_template
        self.tool_settings = tool_settings
        self.metrics = ServerMetrics(name)
        # The most characters one token covers: a prompt longer than that many per context
        # position is refused before it is tokenized.
        self._longest_token = max(len(t) for t in llm.tokenizer.hf_tokenizer.get_vocab())
        self._compiles = ThreadPoolExecutor(
            COMPILE_THREADS, thread_name_prefix="guidedec-serve-compile", initializer=lower_priority
        )

    # --- small endpoints ---------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "active_requests": self.engine.num_active}

    async def version(self) -> dict[str, str]:
        return {"version": guidedec.__version__}

    async def prometheus(self) -> Response:
        scheduler = self.llm.scheduler
        text = self.metrics.render(running=len(scheduler.running), waiting=len(scheduler.waiting))
        return Response(text, media_type=CONTENT_TYPE)

    async def models(self) -> dict[str, Any]:
        card = {
            "id": self.name,
            "object": "model",
            "created": 0,
            "owned_by": "guidedec",
            "root": self.name,
            "parent": None,
            "max_model_len": self.llm.max_model_len,
        }
        return {"object": "list", "data": [card]}

    async def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        self._check_model(body.model)
        hf = _hf(self.llm)
        if body.messages is not None:
            if body.tools is not None:
                check_tools(body.tools)
            text = self._render(
                body.messages,
                body.tools,
                body.chat_template,
                body.chat_template_kwargs,
                body.add_generation_prompt,
            )
            tokens = self.llm.tokenizer.encode(text)
        else:
            assert body.prompt is not None
            tokens = list(hf.encode(body.prompt, add_special_tokens=body.add_special_tokens))
        out: dict[str, Any] = {
            "count": len(tokens),
            "max_model_len": self.llm.max_model_len,
            "tokens": tokens,
        }
        if body.return_token_strs:
            out["token_strs"] = hf.convert_ids_to_tokens(tokens)
        return out

    async def detokenize(self, body: DetokenizeRequest) -> dict[str, str]:
        self._check_model(body.model)
        vocab = self.llm.tokenizer.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequestError(f"token ids must be in [0, {vocab}): {bad[:5]}", "tokens")
        return {"prompt": self.llm.tokenizer.decode(body.tokens)}

    # --- generation --------------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, request: Request) -> Any:
        self._check_request(body)
        prompts = _prompts(body.prompt)
        if body.echo and body.logprobs is not None:
            raise BadRequestError(
                "echo with logprobs is not supported by guidedec (prompt log-probabilities)",
                "echo",
            )
        params, ids = await self._params_for(
            body, prompts, body.max_tokens or DEFAULT_COMPLETION_TOKENS
        )
        lengths = [len(i) for i in ids]
        choices = expand(prompts, params, body.n)
        shape = Shape("cmpl", "text_completion", self.name, include_usage=body.include_usage)
        echoes = [self._echo(p) if body.echo else "" for p in prompts]
        if body.stream:
            return _sse(self._stream_completion(choices, shape, echoes, sum(lengths), body))
        outputs = await self._collect(choices, request)
        rows = []
        for choice, output in zip(choices, outputs, strict=True):
            echo = echoes[choice.prompt_index]
            row: dict[str, Any] = {
                "index": choice.index,
                "text": echo + self._full_text(output),
                "logprobs": None,
                "finish_reason": output.finish_reason,
                **guidedec_fields(output),
            }
            if body.logprobs is not None and output.logprobs is not None:
                row["logprobs"] = completion_logprobs(output.logprobs, self.llm.tokenizer)
            rows.append(row)
        return {**shape.wrap(shape.kind, rows), "usage": usage(outputs, sum(lengths))}

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Any:
        self._check_request(body)
        template = body.chat_template or self.chat_template or _hf(self.llm).chat_template
        calls = self.tool_settings.for_request(
            body.tools,
            body.tool_choice,
            parallel=body.parallel_tool_calls,
            template=template,
            guided_otherwise=bool(
                body.response_format not in (None, {"type": "text"})
                or body.structured_outputs
                or body.top_level_guides()
            ),
        )
        prompt = self._render(
            body.messages,
            body.tools,
            body.chat_template,
            body.chat_template_kwargs,
            body.add_generation_prompt,
        )
        max_tokens = body.max_completion_tokens or body.max_tokens
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        [params], [prompt_ids] = await self._params_for(body, [prompt], max_tokens, calls=calls)
        thought = self.llm.reasoning is not None and self.llm.reasoning.thinks_at_start(prompt_ids)
        choices = expand([prompt], [params], body.n)
        shape = Shape("chatcmpl", "chat.completion", self.name, include_usage=body.include_usage)
        if body.stream:
            return _sse(self._stream_chat(choices, shape, calls, len(prompt_ids), body, thought))
        outputs = await self._collect(choices, request)
        rows = []
        for choice, output in zip(choices, outputs, strict=True):
            message, reason = _chat_message(output, calls)
            if self.llm.reasoning is not None:
                message["reasoning_content"] = output.reasoning
            row: dict[str, Any] = {
                "index": choice.index,
                "message": message,
                "logprobs": None,
                "finish_reason": reason,
                **guidedec_fields(output),
            }
            if body.logprobs and output.logprobs is not None:
                row["logprobs"] = chat_logprobs(output.logprobs, self.llm.tokenizer)
            rows.append(row)
        return {**shape.wrap(shape.kind, rows), "usage": usage(outputs, len(prompt_ids))}

    def _check_request(self, body: _Request) -> None:
        self._check_model(body.model)
        problem = body.problem()
        if problem is not None:
            raise BadRequestError(problem[1], problem[0])

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise ModelNotFoundError(model)

    def _render(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        chat_template: str | None,
        chat_template_kwargs: dict[str, Any] | None,
        add_generation_prompt: bool,
    ) -> str:
        """The prompt of ``messages``, with ``tools`` shown to the model (the request's
        ``tool_choice`` aside, as vLLM does), through the request's chat template, else the
        server's, else the model's."""
        try:
            return render_chat(
                [m.model_dump(exclude_none=True) for m in messages],
                _hf(self.llm),
                chat_template=chat_template or self.chat_template,
                chat_template_kwargs=chat_template_kwargs,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
            )
        except ValueError as exc:
            raise BadRequestError(str(exc), "messages") from exc

    def _full_text(self, output: RequestOutput) -> str:
        """A completion's text: with a reasoning parser, the thinking and its markers too (as
        vLLM's completions endpoint, which parts nothing); the guide applies to what follows
        ``</think>``."""
        parser = self.llm.reasoning
        if parser is None or output.reasoning is None or parser.end_id not in output.token_ids:
            return output.text
        end = output.token_ids.index(parser.end_id)
        return self.llm.tokenizer.decode(output.token_ids[: end + 1]) + output.text

    def _echo(self, prompt: Prompt) -> str:
        return prompt if isinstance(prompt, str) else self.llm.tokenizer.decode(list(prompt))

    async def _params_for(
        self,
        body: _Request,
        prompts: Sequence[Prompt],
        max_tokens: int | None,
        *,
        calls: ToolCalls | None = None,
    ) -> tuple[list[SamplingParams], list[list[int]]]:
        """Each prompt's sampling parameters (the guide compiled once) and its tokens."""
        guide = guide_for_request(
            response_format=body.response_format,
            structured_outputs=body.structured_outputs,
            tool_guide=None if calls is None else calls.guide(),
            top_level=body.top_level_guides(),
        )
        ids = [await asyncio.to_thread(self._check_prompt, p) for p in prompts]
        params = [self._sampling(body, len(i), max_tokens, guide) for i in ids]
        if guide is not None:
            await self._compile(guide, _guide_param(body, calls))
        return params, ids

    def _sampling(
        self,
        body: _Request,
        prompt_len: int,
        max_tokens: int | None,
        guide: GuidedDecodingParams | None,
    ) -> SamplingParams:
        room = self.llm.max_model_len - prompt_len
        given = body.max_tokens if isinstance(body, CompletionRequest) else None
        if isinstance(body, ChatCompletionRequest):
            given = body.max_completion_tokens or body.max_tokens
        if max_tokens is None:
            max_tokens = room
        elif given is None:
            max_tokens = min(max_tokens, room)  # a default never exceeds the room
        if max_tokens > room:
            raise BadRequestError(
                f"max_tokens={max_tokens} is more than the {room} tokens left in the model's "
                f"context of {self.llm.max_model_len} after the prompt's {prompt_len}",
                "max_tokens",
            )
        if body.thinking_token_budget is not None and self.llm.reasoning is None:
            raise BadRequestError(
                "thinking_token_budget needs a reasoning model: serve with --reasoning-parser",
                "thinking_token_budget",
            )
        logprobs = body.logprobs if isinstance(body, CompletionRequest) else None
        if isinstance(body, ChatCompletionRequest) and body.logprobs:
            logprobs = body.top_logprobs or 0
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=max(body.top_k, 0),
                seed=body.seed,
                stop_token_ids=body.stop_token_ids,
                stop=body.stop or None,
                logprobs=logprobs,
                thinking_token_budget=body.thinking_token_budget,
                guided_decoding=guide,
                close_within_budget=body.close_within_budget,
            )
        except ValueError as exc:  # the message starts with the field's name
            field = str(exc).split(" ", 1)[0]
            raise BadRequestError(str(exc), field if field in _SAMPLING_FIELDS else None) from exc

    def _check_prompt(self, prompt: Prompt) -> list[int]:
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
        return tokenized.token_ids

    async def _compile(self, guide: Any, param: str) -> None:
        """Compile on a compile thread (the event loop goes on, the compile at a lower priority
        than the engine's steps), warming the engine's cache."""
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._compiles, self.llm.factory.compile, guide)
        except (GuidedecError, ValueError) as exc:
            raise BadRequestError(f"invalid guide: {exc}", param) from exc

    async def _collect(self, choices: Sequence[Choice], request: Request) -> list[RequestOutput]:
        outputs = await collect(self.engine, choices, request)
        for output in outputs:
            self.metrics.record(output)
        return outputs

    def _ended(
        self, row: dict[str, Any], output: RequestOutput | None, outputs: list[RequestOutput]
    ) -> dict[str, Any]:
        """A stream chunk's choice, with the guidedec fields of the output it ends, if any."""
        if output is not None:
            row.update(guidedec_fields(output))
            outputs.append(output)
            self.metrics.record(output)
        return row

    async def _stream_completion(
        self,
        choices: Sequence[Choice],
        shape: Shape,
        echoes: Sequence[str],
        prompt_tokens: int,
        body: CompletionRequest,
    ) -> AsyncIterator[dict[str, Any]]:
        texts = {c.index: TextStream(self.llm.tokenizer, c.params.stop) for c in choices}
        if body.echo:
            for c in choices:
                yield shape.chunk(_completion_choice(c.index, echoes[c.prompt_index], None))
        outputs: list[RequestOutput] = []
        async for choice, delta in merged(self.engine, choices):
            output = delta.output
            final = None if output is None else output.text
            piece = texts[choice.index].push(delta.token_ids, final_text=final)
            reason = None if output is None else output.finish_reason
            if not (piece or reason):
                continue
            row = _completion_choice(choice.index, piece, reason)
            if body.logprobs is not None and delta.logprobs:
                row["logprobs"] = completion_logprobs(delta.logprobs, self.llm.tokenizer)
            yield shape.chunk(self._ended(row, output, outputs))
        if shape.include_usage:
            yield shape.usage_chunk(outputs, prompt_tokens)

    async def _stream_chat(
        self,
        choices: Sequence[Choice],
        shape: Shape,
        calls: ToolCalls | None,
        prompt_tokens: int,
        body: ChatCompletionRequest,
        thought: bool,
    ) -> AsyncIterator[dict[str, Any]]:
        for c in choices:
            yield shape.chunk(_chat_choice(c.index, {"role": "assistant", "content": ""}, None))
        texts = {
            c.index: ReasoningStream(
                self.llm.reasoning, self.llm.tokenizer, thought=thought, stop=c.params.stop
            )
            for c in choices
        }
        streams = {c.index: ToolCallStream(calls) for c in choices} if calls else {}
        outputs: list[RequestOutput] = []
        async for choice, delta in merged(self.engine, choices):
            output = delta.output
            stream = texts[choice.index]
            thinking, piece = stream.push(delta.token_ids, output)
            reason: str | None = None if output is None else output.finish_reason
            message: dict[str, Any] = {"reasoning_content": thinking} if thinking else {}
            if calls:
                tools = streams[choice.index]
                text, tool_calls = tools.deltas(stream.content.sent, final=reason is not None)
                message |= {"content": text} if text else {}
                message |= {"tool_calls": tool_calls} if tool_calls else {}
                reason = reason and calls.finish_reason(reason, tools.num_calls)
            elif piece:
                message["content"] = piece
            if not (message or reason):
                continue
            row = _chat_choice(choice.index, message, reason)
            if body.logprobs and delta.logprobs:
                row["logprobs"] = chat_logprobs(delta.logprobs, self.llm.tokenizer)
            yield shape.chunk(self._ended(row, output, outputs))
        if shape.include_usage:
            yield shape.usage_chunk(outputs, prompt_tokens)


def _prompts(prompt: Any) -> list[Prompt]:
    """``prompt`` of a completion request as a list of prompts: a string, a list of token ids,
    or a list of either."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise BadRequestError("prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if any(isinstance(p, list) and not p for p in prompt):
        raise BadRequestError("prompt must not hold an empty list of token ids", "prompt")
    return list(prompt)


def _completion_choice(index: int, text: str, reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}


def _chat_choice(index: int, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}


def _chat_message(output: RequestOutput, calls: ToolCalls | None) -> tuple[dict[str, Any], str]:
    """The assistant message, with the ``tool_calls`` read out of a tools request's output
    (OpenAI's finish reasons: ``tool_calls``, ``stop`` for a named function, ``length`` for a
    call that closing ended)."""
    if calls is not None and output.complete:
        content, tool_calls = calls.message(output.text)
        if tool_calls:
            reason = calls.finish_reason(output.finish_reason, len(tool_calls))
            return {"role": "assistant", "content": content, "tool_calls": tool_calls}, reason
        return {"role": "assistant", "content": content}, output.finish_reason
    return {"role": "assistant", "content": output.text}, output.finish_reason


_SAMPLING_FIELDS = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "stop", "logprobs"}
)


def _guide_param(body: _Request, calls: ToolCalls | None) -> str:
    if calls:
        return "tools"
    if body.structured_outputs:
        return "structured_outputs"
    top = body.top_level_guides()
    return next(iter(top)) if top else "response_format"


def _hf(llm: LLM) -> Any:
    return llm.tokenizer.hf_tokenizer


def _sse(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
        except ValueError as exc:  # a request the engine refused after the stream began
            yield f"data: {json.dumps(error_body(str(exc)))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


__all__ = ["BadRequestError", "create_app"]
