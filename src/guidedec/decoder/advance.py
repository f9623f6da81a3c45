"""The build's first phase for each request: create its matcher, or advance it by the token
sampled at the previous step (and by a draft request's token), before its rows are filled."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from guidedec.decoder.errors import RequestError
from guidedec.grammar.matcher import FILLED, REJECTED, TERMINATED, GrammarMatcher

if TYPE_CHECKING:
    from guidedec.decoder.buffers import BitmaskBuffers
    from guidedec.decoder.request import GuidedRequest
    from guidedec.decoder.slots import SlotState
    from guidedec.decoder.stats import DecoderStats

_ADVANCED = -1
"""A new token accepted, its row not filled yet (beside the statuses of ``advance_and_fill``)."""
_NO_MATCHER = "has no grammar matcher (an earlier step failed)"
_NO_TOKEN = "is generating but carries no new_token"


class MatcherAdvance:
    """Creates and advances the slots' matchers for a build.

    Args:
        slots: The per-slot matchers and counters.
        buffers: The rows a fused advance fills, and a forced row is written to.
        stats: The decoder's counters (``rows_filled``).
        create: Create a request's matcher in its slot (the decoder's row rules applied).
        forced_next: The one token a closing request's coming row allows, where closing knows
            it before the row is filled (:meth:`BudgetCloser.forced_next`), else None.
        moved: Tell closing that a slot's matcher moved by more than its row's token
            (:meth:`BudgetCloser.moved`).
    """

    def __init__(
        self,
        slots: SlotState,
        buffers: BitmaskBuffers,
        stats: DecoderStats,
        create: Callable[[GuidedRequest], None],
        forced_next: Callable[[GuidedRequest], int | None],
        moved: Callable[[int], None],
    ) -> None:
        self.slots, self.buffers, self.stats, self.create = slots, buffers, stats, create
        self.forced_next, self.moved = forced_next, moved
        # Generation-only requests whose matcher init_disagg_gen_requests made (True) or failed
        # to make (False, already reported) for the coming target build.
        self.disagg_init: dict[int, bool] = {}

    def running(
        self,
        req: GuidedRequest,
        offset: int,
        drafts: tuple[int, ...],
        *,
        closes: bool,
        fuse: bool,
    ) -> tuple[GrammarMatcher, bool] | None:
        """Advance a running request's matcher by its new token (``fuse``: and fill its row in
        the same call). Returns the matcher and whether its row is filled already; None when
        the request has no row to fill: its grammar has ended, or closing forced its row to
        its witness's next token (``closes``: the request closes within its budget)."""
        slots, slot = self.slots, req.seq_slot
        matcher = slots.matchers[slot]
        if matcher is None:
            raise RequestError(_NO_MATCHER)
        slots.num_verifiable_tokens[slot] = 1 + len(drafts)
        token = req.new_token
        if token is None:
            if not req.refill:
                raise RequestError(_NO_TOKEN)
            self.moved(slot)  # closing replays its witness from where the matcher is
            return None if matcher.is_terminated() else (matcher, False)
        if req.prior_tokens and not self._feed_prior(req, matcher):
            return None  # the grammar ended inside them
        forced = self.forced_next(req) if closes else None
        if fuse and forced is None:
            status = matcher.advance_and_fill(token, self.buffers.bitmask_host, offset)
        elif matcher.advance(token):
            status = TERMINATED if matcher.is_terminated() else _ADVANCED
        else:
            status = REJECTED
        if status == REJECTED:  # a rejection fails the request anyway
            if matcher.is_terminated():
                return None  # accepted a stop token already: see start
            why = matcher.error()
            raise RequestError(
                f"sampled token {token} is rejected by its grammar" + (f" ({why})" if why else "")
            )
        slots.num_advanced_tokens[slot] += 1
        if status == TERMINATED:
            return None
        if forced is not None:
            self.buffers.force_row(offset, forced)
            slots.num_guided_tokens[slot] = 1
            self.stats.rows_filled += 1
            return None
        return matcher, status == FILLED

    def start(self, req: GuidedRequest, drafts: tuple[int, ...]) -> GrammarMatcher | None:
        """Create or advance the matcher of any other request (a new one, a draft request, a
        generation-only one at its first step); returns it when its new-token row is to be
        filled, None when nothing is to be masked."""
        init, advance = req.require_matcher_init(), req.require_matcher_advance()
        if init and req.is_generation_only_first_iteration:
            created = self.disagg_init.pop(req.request_id, None)
            if created is False:
                return None  # its failure was reported by init_disagg_gen_requests
            init = created is None
        if not (init or advance):
            return None
        slots, slot = self.slots, req.seq_slot
        if init:
            self.create(req)
        matcher = slots.matchers[slot]
        if matcher is None:
            if req.is_draft:
                slots.is_draft_terminated[slot] = True
                return None
            raise RequestError(_NO_MATCHER)
        if advance and matcher.is_terminated():
            # The matcher has accepted a stop token already: inside the drafts verified at the
            # previous iteration (an overlap scheduler schedules the request once more before it
            # sees it finish), or at an earlier step of this drafting loop. Nothing to advance
            # or mask: the request finishes at this iteration. Any verified count rolls back
            # nothing (it is clamped to the zero advances).
            slots.num_verifiable_tokens[slot] = 1 + len(drafts)
            if req.is_draft:
                slots.is_draft_terminated[slot] = True
            return None
        if advance and req.prior_tokens and not self._feed_prior(req, matcher):
            return None  # the grammar ended inside them
        if advance and not self._accept(req, matcher):
            return None
        slots.num_verifiable_tokens[slot] = 1 + len(drafts)
        if req.is_draft:  # a draft request has no drafts: its advances end here
            slots.num_advanced_draft_tokens[slot] += slots.num_advanced_tokens[slot]
        return None if matcher.is_terminated() else matcher

    def _feed_prior(self, req: GuidedRequest, matcher: GrammarMatcher) -> bool:
        """Feed ``prior_tokens`` (counted as advances); False when the grammar has ended at or
        inside them (what follows is not fed: the output ends there)."""
        slots, slot = self.slots, req.seq_slot
        for token in req.prior_tokens:
            if matcher.is_terminated():
                return False
            if not matcher.accept_token(token):
                raise RequestError(f"token {token} is rejected by its grammar")
            slots.num_advanced_tokens[slot] += 1
        self.moved(slot)
        return not matcher.is_terminated()

    def _accept(self, req: GuidedRequest, matcher: GrammarMatcher) -> bool:
        """Feed ``new_token``; False when a draft request's guiding stops here (nothing to roll
        back: a rejected token leaves the matcher unchanged)."""
        slots, slot = self.slots, req.seq_slot
        if req.is_draft and slots.is_draft_terminated[slot]:
            return False
        if req.new_token is None:
            raise RequestError(_NO_TOKEN)
        if not matcher.accept_token(req.new_token):
            if req.is_draft:
                slots.is_draft_terminated[slot] = True
                return False
            raise RequestError(f"sampled token {req.new_token} is rejected by its grammar")
        slots.num_advanced_tokens[slot] += 1
        return True
