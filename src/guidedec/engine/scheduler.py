"""Continuous batching: sequence slots, admission, and a per-step token budget with chunked
prefill."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from guidedec.engine.request import Request, Status


@dataclass(slots=True)
class Scheduled:
    """One request's share of a step: the tokens it feeds and the logits rows it gets back."""

    request: Request
    token_ids: list[int]
    is_prefill: bool
    is_last_chunk: bool = False  # a prefill chunk that ends the prompt: sample the first token

    @property
    def num_logits(self) -> int:
        """Logits rows: one for a prefill chunk (used at the last chunk only), one per fed
        token for generation (the new token and each draft token)."""
        return 1 if self.is_prefill else len(self.token_ids)

    @property
    def verifies(self) -> bool:
        """Whether the step verifies drafts of the request: rows for its new token and each
        draft."""
        return not self.is_prefill and len(self.token_ids) > 1

    @property
    def draws_one(self) -> bool:
        """Whether the step samples (not greedy) one token from the request's last row,
        verifying no drafts: its last prompt chunk, or a decode step without drafts."""
        takes_one = self.is_last_chunk if self.is_prefill else len(self.token_ids) == 1
        return takes_one and not self.request.params.is_greedy


class Scheduler:
    """Admits requests into ``max_num_seqs`` slots and fills each step's ``max_num_tokens``.

    Requests join between steps as slots free up, in arrival order; one whose grammar is still
    compiling waits without holding back the others. Each step serves generating requests first
    (each feeds its last token and its draft tokens), then prompt chunks with what is left of the
    budget, so a long prompt is prefilled over several steps. A generating request with
    ``sit_out`` steps to wait (its masks are slow: see :mod:`guidedec.engine.pacing`) is
    left out of that many steps that serve other requests; it is never left out of a step that
    would serve nothing else.
    """

    def __init__(self, *, max_num_seqs: int, max_num_tokens: int) -> None:
        if max_num_seqs < 1 or max_num_tokens < 1:
            raise ValueError("max_num_seqs and max_num_tokens must be >= 1")
        self.max_num_tokens = max_num_tokens
        self.free_slots = deque(range(max_num_seqs))
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_sat_out = 0  # requests left out of the last step's batch (sit_out)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        """This step's batch, in logits-row order: generating requests, then prefill chunks."""
        self._admit()
        budget = self.max_num_tokens
        batch: list[Scheduled] = []
        generating = [req for req in self.running if not req.in_prefill]
        waiting = [req for req in generating if req.sit_out > 0]
        if waiting and len(waiting) == len(self.running):
            waiting = []  # nothing else to serve: none waits
        for req in generating:
            if req.sit_out > 0 and waiting:
                req.sit_out -= 1
                continue
            req.sit_out = 0
            tokens = [req.all_token_ids[-1], *req.draft_tokens]
            batch.append(Scheduled(req, tokens, is_prefill=False))
            budget -= len(tokens)
        for req in self.running:
            if req.in_prefill and budget > 0:
                end = min(len(req.prompt_token_ids), req.num_computed + budget)
                chunk = req.prompt_token_ids[req.num_computed : end]
                last = end == len(req.prompt_token_ids)
                batch.append(Scheduled(req, chunk, is_prefill=True, is_last_chunk=last))
                budget -= len(chunk)
        self.num_sat_out = len(waiting)
        return batch

    def _admit(self) -> None:
        for req in list(self.waiting):
            if not self.free_slots:
                return
            if req.status is Status.WAITING:
                self.waiting.remove(req)
                req.slot = self.free_slots.popleft()
                req.status = Status.RUNNING
                self.running.append(req)

    def remove(self, request: Request) -> int | None:
        """Take a finished or aborted request out; returns the slot it freed, if it had one."""
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        slot, request.slot = request.slot, None
        if slot is not None:
            self.free_slots.append(slot)
        return slot
