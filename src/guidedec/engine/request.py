"""A request's life in the engine, and what the caller gets back."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import torch

from guidedec.engine.logprobs import TokenLogprob
from guidedec.engine.runner import KVState
from guidedec.engine.sampling import SamplingParams

FinishReason = Literal["stop", "length", "grammar_error", "abort"]


class Status(Enum):
    """Where a request is: its grammar compiling, waiting for a slot, running, or done."""

    COMPILING = "compiling"
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times of one request, in seconds since the epoch of ``time.perf_counter``."""

    arrival: float = field(default_factory=time.perf_counter)
    grammar_ready: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass(slots=True)
class RequestOutput:
    """One request's result.

    Attributes:
        request_id: The id ``LLM.generate`` gave it (its index in the prompts when not given).
        prompt: The prompt text, or None when the prompt was given as token ids.
        prompt_token_ids: The prompt's tokens.
        text: The generated text (the stop token excluded).
        token_ids: The generated tokens (the stop token excluded).
        finish_reason: ``"stop"`` (a stop token, with the grammar complete where there is one),
            ``"length"`` (``max_tokens`` or the model's context; or budget-aware closing ended a
            guided output complete: see ``closed_from``), ``"grammar_error"`` (the guide
            does not compile, its compilation timed out, or decoding reached a dead end) or
            ``"abort"``.
        error: What went wrong, for ``grammar_error``; None otherwise.
        incomplete: For a guided output that ended ``length`` before its guide was complete,
            why: no completion fitted the tokens left, or closing was off. None otherwise.
        closed_from: For a guided output that budget-aware closing ended (``finish_reason``
            ``"length"``, the output complete and valid): the character of ``text`` from which
            the budget, not the model, chose the tokens (closing followed the shortest way to
            the guide's end it found). None otherwise.
        metrics: Timings.
        logprobs: With ``SamplingParams.logprobs``, one entry per token of ``token_ids``.
        reasoning: With a reasoning parser, the thinking's text (``text`` is the content after
            it, which the guide applies to); None when the output has none.
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    error: str | None
    metrics: RequestMetrics
    incomplete: str | None = None
    logprobs: list[TokenLogprob] | None = None
    reasoning: str | None = None
    closed_from: int | None = None

    @property
    def complete(self) -> bool:
        """Whether the output ended at a stop token (its guide complete, where it has one): by
        itself (``stop``), or closed by the budget (``length`` with ``closed_from``)."""
        return self.finish_reason == "stop" or self.closed_from is not None


@dataclass(slots=True, eq=False)
class Request:
    """The engine's state of one request.

    The KV cache holds ``num_computed`` tokens of ``all_token_ids``; during generation that is
    every token but the last sampled one, which the next step feeds (with any draft tokens).
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    status: Status = Status.WAITING
    slot: int | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    draft_tokens: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None  # the draft model's distribution per draft token
    draft_generator: torch.Generator | None = None  # the draft model's sampling RNG
    num_accepted_drafts: int = 0
    generation_only_first: bool = False  # prefill done by another engine, first step here
    prefill_only: bool = False  # hand the request over once its first token is sampled
    handoff_cache: KVState | None = None  # a prefilled KV cache to load into its slot
    finish_reason: FinishReason | None = None
    error: str | None = None
    incomplete: str | None = None
    text_end: int | None = None  # where a stop string starts in the decoded output
    logprobs: list[TokenLogprob] | None = None  # one per output token, when asked for
    thought: bool = False  # it started inside a reasoning model's thinking
    thinking: bool = False  # it is inside it now: unguided
    reasoning_end: int | None = None  # the index of its </think> in output_token_ids
    guide_starts: bool = False  # thinking just ended: the next step creates its matcher
    steered: bool | None = None  # its tokens are checked against its schema (None: not known yet)
    broken: str | None = None  # a settled value breaks its schema (see guidedec.engine.steering)
    forced_from: int | None = None  # the first output token that budget-aware closing forced
    closed: bool = False  # complete, its end forced by closing: finish "length"
    sit_out: int = 0  # steps to leave it out of, its masks being slow (see Scheduler)
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def tokens_left(self, max_model_len: int) -> int:
        """The tokens it may still emit: up to ``max_tokens``, within the model's context."""
        return min(
            self.params.max_tokens - len(self.output_token_ids),
            max_model_len - len(self.prompt_token_ids) - len(self.output_token_ids),
        )

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        self.status, self.finish_reason, self.error = Status.FINISHED, reason, error
        self.metrics.finished = time.perf_counter()

    def output(
        self, text: str, reasoning: str | None = None, closed_from: int | None = None
    ) -> RequestOutput:
        assert self.finish_reason is not None
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            text=text if self.text_end is None else text[: self.text_end],
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            error=self.error,
            metrics=self.metrics,
            incomplete=self.incomplete,
            logprobs=None if self.logprobs is None else list(self.logprobs),
            reasoning=reasoning,
            closed_from=closed_from,
        )
