"""Disaggregated serving in one process: what a prefill engine hands to a decode engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from guidedec.engine.request import Request, RequestMetrics, RequestOutput, Status
from guidedec.engine.runner import KVState, SlotRunner
from guidedec.engine.sampling import SamplingParams, make_draft_generator
from guidedec.engine.scheduler import Scheduled


@dataclass(frozen=True)
class Handoff:
    """A prefilled request: its KV cache, its first token and its state.

    ``output`` is set instead when the request already finished during prefill (its first token
    was a stop token, ``max_tokens`` was 1, or its guide failed); the decode engine returns it.
    """

    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    first_token: int | None = None
    kv_cache: KVState | None = None
    rng_state: torch.Tensor | None = None
    output: RequestOutput | None = None

    @classmethod
    def from_request(cls, request: Request, kv_cache: KVState) -> Handoff:
        generator = request.generator
        return cls(
            prompt=request.prompt,
            prompt_token_ids=tuple(request.prompt_token_ids),
            params=request.params,
            first_token=request.output_token_ids[0],
            kv_cache=kv_cache,
            rng_state=None if generator is None else generator.get_state(),
        )

    @classmethod
    def finished(cls, output: RequestOutput, params: SamplingParams) -> Handoff:
        return cls(output.prompt, tuple(output.prompt_token_ids), params, output=output)

    def to_request(self, request_id: int) -> Request:
        """The request as the decode engine continues it: the KV cache holds the prompt, the
        first token is fed at its first step, where its grammar matcher is created."""
        if self.first_token is None or self.kv_cache is None:
            raise ValueError("this handoff carries a finished request, not one to continue")
        generator = None
        if self.rng_state is not None:
            generator = torch.Generator()
            generator.set_state(self.rng_state)
        request = Request(
            request_id,
            self.prompt,
            list(self.prompt_token_ids),
            self.params,
            generator,
            status=Status.WAITING,
            output_token_ids=[self.first_token],
            num_computed=len(self.prompt_token_ids),
            generation_only_first=True,
            handoff_cache=self.kv_cache,
            metrics=RequestMetrics(),
        )
        request.draft_generator = make_draft_generator(self.params)
        return request


def import_caches(batch: Sequence[Scheduled], runner: SlotRunner) -> None:
    """Put the KV caches that handed-off requests of ``batch`` carry into their slots."""
    for s in batch:
        req = s.request
        if req.handoff_cache is not None and req.slot is not None:
            runner.import_cache(req.slot, req.handoff_cache)
            req.handoff_cache = None
