"""The OpenAI-compatible HTTP API, with vLLM's names and shapes: ``/v1/completions``,
``/v1/chat/completions`` (server-sent events when ``stream`` is true), ``/v1/models``, and
``/health``, ``/version``, ``/metrics``, ``/tokenize``, ``/detokenize``.

Bad input (a malformed body, a field of the wrong type, an option guidedec does not implement, a
guide that does not compile, a prompt longer than the model's context) gets HTTP 400 with an
OpenAI error object naming the problem; an unknown model 404; the server keeps serving. A client
that disconnects aborts its request, streaming or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response

import guidedec
from guidedec.engine import LLM, RequestOutput
from guidedec.engine.chat import render_chat
from guidedec.engine.prompts import Prompt
from guidedec.server.async_engine import AsyncEngine
from guidedec.server.auth import ApiKeyAuth
from guidedec.server.choices import Choice, collect, expand
from guidedec.server.errors import BadRequestError, ModelNotFoundError, add_error_handlers
from guidedec.server.limits import DEFAULT_MAX_REQUEST_BYTES, BodyLimit
from guidedec.server.metrics import CONTENT_TYPE, ServerMetrics
from guidedec.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    _Request,
)
from guidedec.server.request_params import RequestParams, completion_prompts
from guidedec.server.responses import (
    Shape,
    chat_logprobs,
    completion_logprobs,
    guidedec_fields,
    usage,
)
from guidedec.server.streaming import Streams, sse
from guidedec.server.structured import check_tools
from guidedec.server.tool_calls import ToolCalls, ToolSettings

DEFAULT_COMPLETION_TOKENS = 16
"""``max_tokens`` of a completion that gives none (OpenAI's and vLLM's default)."""
DEFAULT_CHAT_TOKENS = 256
"""``max_tokens`` of a chat completion that gives none (``--default-max-tokens``): a few
seconds of output on a CPU, where the context's room (vLLM's default) takes minutes."""


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
    _add_cors(app, allowed_origins, allowed_methods, allowed_headers, allow_credentials)
    app.state.engine = engine
    api = _Api(llm, engine, name, default_max_tokens, chat_template, tool_settings)
    add_error_handlers(app, api.metrics)
    _add_routes(app, api)
    return app


def _add_cors(
    app: FastAPI,
    origins: Sequence[str],
    methods: Sequence[str],
    headers: Sequence[str],
    credentials: bool,
) -> None:
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=list(methods),
        allow_headers=list(headers),
        allow_credentials=credentials,
    )


def _add_routes(app: FastAPI, api: _Api) -> None:
    app.get("/health")(api.health)
    app.get("/version")(api.version)
    app.get("/metrics")(api.prometheus)
    app.get("/v1/models")(api.models)
    app.post("/tokenize")(api.tokenize)
    app.post("/detokenize")(api.detokenize)
    app.post("/v1/completions", response_model=None)(api.completions)
    app.post("/v1/chat/completions", response_model=None)(api.chat_completions)


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
        self.params = RequestParams(llm)
        self.streams = Streams(llm, engine, self.metrics)

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
        prompts = completion_prompts(body.prompt)
        if body.echo and body.logprobs is not None:
            raise BadRequestError(
                "echo with logprobs is not supported by guidedec (prompt log-probabilities)",
                "echo",
            )
        params, ids = await self.params.prepare(
            body, prompts, body.max_tokens or DEFAULT_COMPLETION_TOKENS
        )
        lengths = [len(i) for i in ids]
        choices = expand(prompts, params, body.n)
        shape = Shape("cmpl", "text_completion", self.name, include_usage=body.include_usage)
        echoes = [self._echo(p) if body.echo else "" for p in prompts]
        if body.stream:
            return sse(self.streams.completion(choices, shape, echoes, sum(lengths), body))
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
        [params], [prompt_ids] = await self.params.prepare(body, [prompt], max_tokens, calls=calls)
        thought = self.llm.reasoning is not None and self.llm.reasoning.thinks_at_start(prompt_ids)
        choices = expand([prompt], [params], body.n)
        shape = Shape("chatcmpl", "chat.completion", self.name, include_usage=body.include_usage)
        if body.stream:
            return sse(self.streams.chat(choices, shape, calls, len(prompt_ids), body, thought))
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

    async def _collect(self, choices: Sequence[Choice], request: Request) -> list[RequestOutput]:
        outputs = await collect(self.engine, choices, request)
        for output in outputs:
            self.metrics.record(output)
        return outputs


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


def _hf(llm: LLM) -> Any:
    return llm.tokenizer.hf_tokenizer


__all__ = ["BadRequestError", "create_app"]
