"""Filling a request's bitmask rows: the new token's row, then one after each draft token it
advances by, each checked (a row that allows nothing is a dead end), timed against the
mask-time limit where a build was slow, and filled in parallel waves where that pays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from guidedec.decoder.errors import DEAD_END, Failure, RequestError
from guidedec.errors import REQUEST_ERRORS
from guidedec.grammar.matcher import FILLED, REJECTED, TERMINATED, GrammarMatcher

if TYPE_CHECKING:
    from guidedec.decoder.buffers import BitmaskBuffers
    from guidedec.decoder.fill_timing import FillTiming
    from guidedec.decoder.request import GuidedRequest
    from guidedec.decoder.slots import SlotState
    from guidedec.decoder.stats import DecoderStats
    from guidedec.grammar.batch_fill import BatchFiller

_ROW_DISAGREES = "draft token {} is allowed by its bitmask row but its grammar rejects it"


class RowFill:
    """A request whose rows ``build`` is filling: the next is ``row`` (``offset + position``)."""

    __slots__ = ("drafts", "matcher", "position", "req", "row")

    def __init__(
        self, req: GuidedRequest, matcher: GrammarMatcher, row: int, drafts: tuple[int, ...]
    ) -> None:
        self.req, self.matcher, self.row, self.drafts = req, matcher, row, drafts
        self.position = 0


class RowFiller:
    """Fills requests' rows into the decoder's buffers, one request at a time or in waves, and
    counts what it filled and advanced in the slots' counters.

    Args:
        buffers: The rows to fill.
        slots: The per-slot counters it updates (advances, rows, verifiable tokens, drafting).
        timing: Whether and how fills are timed.
        filler: Sequential or parallel fills of a wave (:class:`BatchFiller`).
        stats: The decoder's counters (``rows_filled``).
        fail: Report a request's failure and drop its grammar state.
    """

    def __init__(
        self,
        buffers: BitmaskBuffers,
        slots: SlotState,
        timing: FillTiming,
        filler: BatchFiller,
        stats: DecoderStats,
        fail: Callable[[GuidedRequest, Exception, list[Failure]], None],
    ) -> None:
        self.buffers, self.slots, self.timing, self.filler = buffers, slots, timing, filler
        self.stats, self.fail = stats, fail
        self.min_wave = filler.min_parallel_rows  # fewer requests: no wave

    def fill_wave(self, wave: list[RowFill], failures: list[Failure]) -> list[RowFill]:
        """Fill the current row of every request of the wave; returns the next wave.

        A wave too small for a parallel fill is finished request by request, each through all
        its rows (the waves after it would be no larger); this is the common case, kept lean.
        """
        next_wave: list[RowFill] = []
        if self.filler.one_by_one(len(wave)):
            for item in wave:
                try:
                    self.fill_request(item.req, item.matcher, item.row, item.drafts, item.position)
                except REQUEST_ERRORS as exc:
                    self.fail(item.req, exc, failures)
            return next_wave
        errors = self.filler.fill(
            [item.matcher for item in wave],
            self.buffers.bitmask_host,
            [item.row for item in wave],
        )
        for item, error in zip(wave, errors, strict=True):
            try:
                if error is not None:
                    raise error
                if self._after_fill(item):
                    next_wave.append(item)
            except REQUEST_ERRORS as exc:
                self.fail(item.req, exc, failures)
        return next_wave

    def fill_request(
        self,
        req: GuidedRequest,
        matcher: GrammarMatcher,
        row: int,
        drafts: tuple[int, ...],
        start: int = 0,
        *,
        filled: bool = False,
    ) -> None:
        """Fill one request's rows one after another from position ``start`` (row ``row``, which
        ``filled`` says is filled already): the new token's row is position 0, then one after
        each draft token. The same checks as :meth:`_after_fill`, in one loop."""
        slot, slots, b = req.seq_slot, self.slots, self.buffers
        bitmask, mask, row_is_valid = b.bitmask_host, b.token_mask_words, b.row_is_valid
        # HostRowChecker.allows inline: one call less per draft row.
        words, row_words, vocab = row_is_valid.flat, row_is_valid.row_words, row_is_valid.vocab_size
        unchecked = matcher.unchecked_advance
        timed = self.timing.fill if self.timing.active else None
        if timed is not None:  # a timed build never fills ahead (advance_and_fill)
            timed(matcher, bitmask, row, slot)
        elif not filled:
            matcher.fill_next_token_bitmask(bitmask, row)
        guided = advanced = 0
        last = len(drafts)
        for position in range(start, last + 1):
            # A row that allows the next draft token allows a token: no scan of the row.
            token = drafts[position] if position < last else -1
            allowed = (
                0 <= token < vocab and words[row * row_words + (token >> 5)] >> (token & 31) & 1
            )
            if not (allowed or row_is_valid(row)):
                if position > 0:
                    break
                if req.is_draft:
                    slots.is_draft_terminated[slot] = True
                    return
                raise RequestError(DEAD_END)
            mask[row] = 1
            guided += 1
            if position == last:
                break
            if not allowed:  # verification cannot accept the token: the row masks it out
                slots.num_verifiable_tokens[slot] = position + 1
                break
            row += 1
            status = self.draft_row(matcher, token, row, slot, timed=timed is not None)
            if status == REJECTED:
                if unchecked:
                    raise RequestError(_ROW_DISAGREES.format(token))
                slots.num_verifiable_tokens[slot] = position + 1
                break
            advanced += 1
            if status == TERMINATED:
                break
        slots.num_advanced_tokens[slot] += advanced
        slots.num_guided_tokens[slot] += guided
        self.stats.rows_filled += slots.num_guided_tokens[slot]

    def draft_row(
        self, matcher: GrammarMatcher, token: int, row: int, slot: int, *, timed: bool
    ) -> int:
        """Advance by a draft token, then fill the row after it (``row``); the status, as
        :meth:`GrammarMatcher.advance_and_fill` returns it."""
        bitmask = self.buffers.bitmask_host
        if not timed:
            return matcher.advance_and_fill(token, bitmask, row)
        unchecked = matcher.unchecked_advance
        if not (matcher.advance(token) if unchecked else matcher.accept_token(token)):
            return REJECTED
        if matcher.is_terminated():
            return TERMINATED
        self.timing.fill(matcher, bitmask, row, slot)
        return FILLED

    def _accept_draft(self, matcher: GrammarMatcher, row: int, token: int) -> bool:
        """Advance by the draft token after row ``row``, just filled from the matcher's state:
        the row says whether the grammar accepts it, so a backend's cheaper unchecked accept
        (:meth:`GrammarMatcher.advance`) serves. False (state unchanged) when it is rejected."""
        if not matcher.unchecked_advance:
            return matcher.accept_token(token)
        if not self.buffers.row_is_valid.allows(row, token):
            return False
        if not matcher.advance(token):
            raise RequestError(_ROW_DISAGREES.format(token))
        return True

    def _after_fill(self, item: RowFill) -> bool:
        """Check the row just filled and advance by the next draft token; True (with ``item``
        moved to the next row) when the row after that token is to be filled.

        A dead-end new-token row fails the request (a draft request only stops guiding). The
        draft rows stop at a rejected draft token (verification cannot accept it: the row before
        it masks it out), at termination, or at a dead-end row: the remaining draft positions
        stay unconstrained and are verified as usual.
        """
        req, row, slots = item.req, item.row, self.slots
        slot = req.seq_slot
        if not self.buffers.row_is_valid(row):
            if item.position == 0:
                if not req.is_draft:
                    raise RequestError(DEAD_END)
                slots.is_draft_terminated[slot] = True
            self.stats.rows_filled += slots.num_guided_tokens[slot]
            return False
        self.buffers.token_mask_words[row] = 1
        slots.num_guided_tokens[slot] += 1
        position = item.position
        if position < len(item.drafts):
            if self._accept_draft(item.matcher, row, item.drafts[position]):
                slots.num_advanced_tokens[slot] += 1
                if not item.matcher.is_terminated():
                    item.position, item.row = position + 1, row + 1
                    return True
            else:
                slots.num_verifiable_tokens[slot] = position + 1
        self.stats.rows_filled += slots.num_guided_tokens[slot]
        return False
