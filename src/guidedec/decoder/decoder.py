"""GuidedDecoder: the batched step plus speculative decoding's draft loop and rollbacks.

A verification step advances each matcher through its new (golden) token and then its draft
tokens, filling one row per position. Afterwards the matcher must return to the accepted prefix:

- drafter without logits (n-gram, prompt lookup): ``execute(target_logits)``, verify, then
  ``rollback_rejected_batch(num_accepted_tokens)``;
- drafter with logits (a draft model): ``execute(target_logits)``, verify, then per draft step
  ``add_draft_batch(...)`` and ``execute_draft_batch(draft_logits, draft_step=...)``, which rolls
  back the rejected tokens at step 0 and everything the drafting loop advanced at its last step;
- or, by hand: ``add_batch`` with ``num_accepted_draft_tokens`` set, ``rollback_rejected_tokens()``,
  the drafting loop, then ``rollback_draft_tokens()`` before the next target build.

Invariant: whenever the next build starts, each matcher's state is that of a fresh matcher fed
exactly the request's accepted tokens up to (not including) its new token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from guidedec.decoder.base import BaseGuidedDecoder
from guidedec.decoder.errors import Failure, RequestError, failure_message
from guidedec.decoder.request import GuidedRequest, GuidedRequests
from guidedec.decoder.stats import DecoderStats
from guidedec.errors import REQUEST_ERRORS

__all__ = ["DecoderStats", "Failure", "GuidedDecoder", "GuidedStep", "RequestError"]

TokenCounts = Sequence[int] | torch.Tensor


class GuidedStep(Protocol):
    """What runs a target step of guided decoding: a :class:`GuidedDecoder`, or a
    :class:`~guidedec.decoder.capturable.CapturableGuidedDecoder` that runs a decoder's step as
    host functions."""

    def add_batch(
        self, requests: Sequence[GuidedRequest], *, num_draft_tokens: int | None = None
    ) -> None: ...

    def execute(
        self, logits: torch.Tensor, *, d2t: torch.Tensor | None = None
    ) -> list[Failure]: ...

    def rollback_rejected_batch(self, num_accepted_tokens: TokenCounts) -> list[Failure]: ...


@dataclass(frozen=True, slots=True)
class _DraftStep:
    """One step of the drafting loop, from ``add_draft_batch`` to ``execute_draft_batch``: the
    tokens the draft model consumes, and at step 0 what verification accepted."""

    step: int
    new_tokens: list[int]
    num_accepted_tokens: list[int] | None


class GuidedDecoder(BaseGuidedDecoder):
    """Batched guided decoding with speculative decoding (draft rows, accounting, rollback).

    See :class:`BaseGuidedDecoder` for the buffers and the step, and the module docstring for the
    order of calls in a speculative step. Every method that touches matchers returns the requests
    that cannot go on as ``(request_id, message)``; none raises for one request's sake.
    """

    _next_draft_step: _DraftStep | None = None
    """What the last ``add_draft_batch`` handed to the next ``execute_draft_batch``."""

    def rollback_rejected_tokens(self) -> list[Failure]:
        """Roll each matcher back to the tokens the target accepted in the last verification.

        Call after verification, with the batch of ``add_batch`` carrying each request's
        ``num_accepted_draft_tokens``, and before the first build of the next drafting loop (or
        the next target build when there is none). A second call before the next build does
        nothing.
        """
        batch = self._batch()
        counts = [1 + req.num_accepted_draft_tokens for req in batch.requests]
        return self._rollback_rejected(batch.requests, counts)

    def rollback_rejected_batch(self, num_accepted_tokens: TokenCounts) -> list[Failure]:
        """Restore the accepted prefix right after verification, for drafters without a logits
        loop (n-gram, prompt lookup), which never call ``execute_draft_batch``.

        Args:
            num_accepted_tokens: Per request of the verified batch (the last ``add_batch``), in
                batch order: the tokens verification accepted, counting the new token (so
                ``1 + accepted drafts``; the bonus token sampled after them is not fed yet).
        """
        batch = self._batch()
        counts = _int_list(num_accepted_tokens, len(batch), "num_accepted_tokens")
        return self._rollback_rejected(batch.requests, counts)

    def forced_tokens(self, seq_slot: int, new_token: int, max_tokens: int) -> list[int]:
        """The tokens the slot's grammar forces after ``new_token`` (jump-forward drafts), at
        most ``max_tokens``; the matcher is left at its state. Call after
        :meth:`rollback_rejected_batch` (the matcher holds the accepted prefix, ``new_token``
        not yet fed); [] where the slot has no matcher, rejects ``new_token`` or ends with it.

        Raises:
            RequestError: a backend call failed: the slot's grammar state is dropped (it is no
                longer known), and its request is to be finished as failed.
        """
        matcher = self.grammar_matchers[seq_slot]
        if matcher is None or max_tokens <= 0:
            return []
        try:
            if matcher.is_terminated() or not matcher.accept_token(new_token):
                return []
            try:
                forced = [] if matcher.is_terminated() else matcher.forced_tokens()[:max_tokens]
            finally:
                matcher.rollback(1)
        except REQUEST_ERRORS as exc:
            self.release_slot(seq_slot)
            raise RequestError(f"failed in guided decoding (jump-forward): {exc}") from exc
        return forced

    def rollback_draft_tokens(self) -> list[Failure]:
        """Undo everything the drafting loop advanced and reset its state.

        Call after the drafting loop and before the target build that verifies its drafts.
        ``execute_draft_batch`` does it at its last step; call it yourself when a drafting loop
        ends early.
        """
        failures: list[Failure] = []
        if self.max_num_draft_tokens == 0:
            return failures
        for req in self._batch().valid_requests():
            slot = req.seq_slot
            advanced = self.num_advanced_draft_tokens[slot]
            self.num_advanced_draft_tokens[slot] = 0
            self.num_advanced_tokens[slot] = 0
            self.is_draft_terminated[slot] = False
            matcher = self.grammar_matchers[slot]
            if advanced <= 0 or matcher is None:
                continue
            try:
                matcher.rollback(advanced)
            except REQUEST_ERRORS as exc:
                failures.append((req.request_id, failure_message(req, exc)))
                self._forget(req)
        return failures

    def add_draft_batch(
        self,
        new_tokens: TokenCounts,
        num_accepted_tokens: TokenCounts | None = None,
        *,
        draft_step: int,
    ) -> None:
        """Hand the drafting loop's inputs to the next ``execute_draft_batch``.

        Args:
            new_tokens: Per request of the batch, in batch order, the token the draft model
                consumes at this step: at step 0 the bonus token sampled in verification, then
                the draft token sampled at the previous step.
            num_accepted_tokens: Step 0 only: per request, the tokens verification accepted,
                counting the new token (``1 + accepted drafts``).
            draft_step: 0 for the first step of the drafting loop.
        """
        batch = self._batch()
        accepted = None
        if draft_step == 0:
            if num_accepted_tokens is None:
                raise ValueError("draft_step 0 needs num_accepted_tokens")
            accepted = _int_list(num_accepted_tokens, len(batch), "num_accepted_tokens")[:]
        tokens = _int_list(new_tokens, len(batch), "new_tokens")[:]  # kept past the caller's step
        self._next_draft_step = _DraftStep(draft_step, tokens, accepted)

    def execute_draft_batch(
        self, logits: torch.Tensor, *, d2t: torch.Tensor | None = None, draft_step: int
    ) -> list[Failure]:
        """Mask the draft model's logits for one step of the drafting loop (one row per request).

        Call once per draft step, after ``add_draft_batch`` for the same step and after the
        verification of the batch of the last ``add_batch``. Step 0 turns that batch into draft
        requests (same slots) and first rolls back the tokens verification rejected; the last
        step (``num_draft_tokens - 1`` of that batch) ends by rolling back every draft advance,
        so the next target build starts from the accepted prefix. ``d2t`` maps a pruned draft
        vocabulary to the target's (see :func:`guidedec.bitmask.apply_bitmask`).
        """
        step = self._next_draft_step
        if step is None or step.step != draft_step:
            raise ValueError(f"call add_draft_batch(..., draft_step={draft_step}) first")
        self._next_draft_step = None
        failures = self._start_draft_step(step)
        failures += self.build()
        if draft_step == self._batch().num_draft_tokens - 1:
            failures += self.rollback_draft_tokens()
        self.copy_and_apply(logits, d2t=d2t)
        return failures

    def _start_draft_step(self, step: _DraftStep) -> list[Failure]:
        """Turn the batch into this step's draft requests (at step 0, after rolling back what
        verification rejected)."""
        draft_step, new_tokens = step.step, step.new_tokens
        batch = self._batch()
        if not 0 <= draft_step < batch.num_draft_tokens:
            raise ValueError(
                f"draft_step {draft_step} is outside this batch's drafting loop "
                f"(num_draft_tokens={batch.num_draft_tokens})"
            )
        is_draft_batch = any(req.is_draft for req in batch.requests)
        if draft_step > 0:
            if not is_draft_batch:
                raise ValueError("draft_step > 0 must follow draft_step 0 of the same loop")
            drafts = [req.as_draft(t) for req, t in zip(batch.requests, new_tokens, strict=True)]
            self.requests = GuidedRequests(drafts, batch.num_draft_tokens)
            return []
        if is_draft_batch:
            raise ValueError("draft_step 0 must follow a target batch (add_batch, execute)")
        counts = step.num_accepted_tokens
        assert counts is not None  # add_draft_batch requires it at step 0
        failures = self._rollback_rejected(batch.requests, counts)
        drafts = []
        for req, token, count in zip(batch.requests, new_tokens, counts, strict=True):
            drafts.append(req.as_draft(token, max(count - 1, 0)))
            self.is_draft_terminated[req.seq_slot] = False
            self.num_advanced_draft_tokens[req.seq_slot] = 0
        self.requests = GuidedRequests(drafts, batch.num_draft_tokens)
        return failures

    def _rollback_rejected(
        self, requests: Sequence[GuidedRequest], counts: Sequence[int]
    ) -> list[Failure]:
        failures: list[Failure] = []
        if self.max_num_draft_tokens == 0:
            return failures
        num_advanced, verifiable = self.num_advanced_tokens, self._num_verifiable_tokens
        for i, req in enumerate(requests):  # counts has one per request: callers check
            if req.guided_decoding_params is None:
                continue
            count = counts[i]
            slot = req.seq_slot
            advanced = num_advanced[slot]
            if advanced <= 0:
                continue
            num_advanced[slot] = 0
            matcher = self.grammar_matchers[slot]
            try:
                if not 1 <= count <= verifiable[slot] or matcher is None:
                    raise self._rollback_error(slot, advanced, count)
                if count < advanced:
                    matcher.rollback(advanced - count)
                if advanced > 1:  # drafts were verified: the state moved past the closed row
                    self.closer.moved(slot)
            except REQUEST_ERRORS as exc:
                failures.append((req.request_id, failure_message(req, exc)))
                self._forget(req)
        return failures

    def _rollback_error(self, slot: int, advanced: int, count: int) -> RequestError:
        """Why the advances past ``count`` accepted tokens cannot be undone.

        ``count`` is clamped to ``advanced``: verification may accept tokens past a position where
        the matcher stopped advancing (a stop token inside the drafts, a dead-end row); those
        tokens never reached the matcher. Verification cannot accept more than the grammar let
        through, so a larger count (a rollback that would be negative) is a bookkeeping error.
        """
        verifiable = self._num_verifiable_tokens[slot]
        if 1 <= count <= verifiable:
            return RequestError("has no grammar matcher (an earlier step failed)")
        return RequestError(
            f"cannot roll back its grammar matcher: verification reports {count} accepted "
            f"tokens (new token + drafts) but the matcher advanced {advanced} and its grammar "
            f"allowed {verifiable}, so the rollback would be negative or undo the new token"
        )


def _int_list(values: TokenCounts, length: int, name: str) -> list[int]:
    """``values`` as a list of Python ints: a list of them is returned as it is (the common
    case, with no copy), anything else converted."""
    items = values
    # isinstance against torch.Tensor costs as much as the rest: a list skips it.
    if type(values) is not list and isinstance(values, torch.Tensor):
        items = values.tolist()
    if len(items) != length:
        raise ValueError(f"{name} has {len(items)} entries; the batch has {length} requests")
    if type(items) is list:
        for value in items:
            if type(value) is not int:
                break
        else:
            return items
    return list(map(int, items))
