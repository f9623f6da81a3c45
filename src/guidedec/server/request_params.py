"""A generation request's body to what the engine takes: each prompt's token ids and its
:class:`~guidedec.engine.SamplingParams`, every limit checked and the guide compiled before the
request is queued, so that a bad request is refused (HTTP 400) before it costs the engine a step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from guidedec.engine import LLM, SamplingParams
from guidedec.engine.prompts import Prompt, check_prompt, tokenize
from guidedec.errors import GuidedecError
from guidedec.grammar.host import lower_priority
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.server.errors import BadRequestError
from guidedec.server.limits import too_long_to_fit
from guidedec.server.protocol import ChatCompletionRequest, CompletionRequest, _Request
from guidedec.server.structured import guide_for_request
from guidedec.server.tool_calls import ToolCalls

COMPILE_THREADS = 2
"""Guides the server compiles at once (each first probed in a compile worker, which bounds the
time and the queue)."""

SAMPLING_FIELDS = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "stop", "logprobs"}
)
"""The request fields a :class:`SamplingParams` error may name (its message starts with one)."""


class RequestParams:
    """Turns request bodies into prompts and parameters for one ``llm``."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        # The most characters one token covers: a prompt longer than that many per context
        # position is refused before it is tokenized.
        self._longest_token = max(len(t) for t in llm.tokenizer.hf_tokenizer.get_vocab())
        self._compiles = ThreadPoolExecutor(
            COMPILE_THREADS, thread_name_prefix="guidedec-serve-compile", initializer=lower_priority
        )

    async def prepare(
        self,
        body: _Request,
        prompts: Sequence[Prompt],
        max_tokens: int | None,
        *,
        calls: ToolCalls | None = None,
    ) -> tuple[list[SamplingParams], list[list[int]]]:
        """Each prompt's sampling parameters (the guide compiled once) and its tokens.
        ``max_tokens``: the request's, else the endpoint's default (None: the context's room).

        Raises:
            BadRequestError: naming the field at fault.
        """
        guide = guide_for_request(
            response_format=body.response_format,
            structured_outputs=body.structured_outputs,
            tool_guide=None if calls is None else calls.guide(),
            top_level=body.top_level_guides(),
        )
        ids = [await asyncio.to_thread(self._tokens, p) for p in prompts]
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
        max_tokens = self._max_tokens(body, prompt_len, max_tokens)
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
            raise BadRequestError(str(exc), field if field in SAMPLING_FIELDS else None) from exc

    def _max_tokens(self, body: _Request, prompt_len: int, max_tokens: int | None) -> int:
        """The request's budget: a default never exceeds the context's room; a budget the
        request gives must fit it."""
        room = self.llm.max_model_len - prompt_len
        given = body.max_tokens if isinstance(body, CompletionRequest) else None
        if isinstance(body, ChatCompletionRequest):
            given = body.max_completion_tokens or body.max_tokens
        if max_tokens is None:
            max_tokens = room
        elif given is None:
            max_tokens = min(max_tokens, room)
        if max_tokens > room:
            raise BadRequestError(
                f"max_tokens={max_tokens} is more than the {room} tokens left in the model's "
                f"context of {self.llm.max_model_len} after the prompt's {prompt_len}",
                "max_tokens",
            )
        return max_tokens

    def _tokens(self, prompt: Prompt) -> list[int]:
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


def completion_prompts(prompt: Any) -> list[Prompt]:
    """``prompt`` of a completion request as a list of prompts: a string, a list of token ids,
    or a list of either.

    Raises:
        BadRequestError: an empty prompt or an empty list of token ids.
    """
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise BadRequestError("prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if any(isinstance(p, list) and not p for p in prompt):
        raise BadRequestError("prompt must not hold an empty list of token ids", "prompt")
    return list(prompt)


def _guide_param(body: _Request, calls: ToolCalls | None) -> str:
    """The field a guide that does not compile came from."""
    if calls:
        return "tools"
    if body.structured_outputs:
        return "structured_outputs"
    top = body.top_level_guides()
    return next(iter(top)) if top else "response_format"
