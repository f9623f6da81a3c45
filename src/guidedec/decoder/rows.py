"""Filling a request's bitmask rows: the new token's row, then one after each draft token it
advances by, each checked (a row that allows nothing is a dead end), timed against the
mask-time limit where a build was slow, and filled in parallel waves where that pays.

:class:`RowFilling` holds the decoder methods that do it; :class:`BaseGuidedDecoder` mixes it in
(the hot loop keeps its attribute reads on one object).
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

import torch

from guidedec.errors import REQUEST_ERRORS, GuidedecError
from guidedec.grammar.matcher import FILLED, REJECTED, TERMINATED, GrammarMatcher

if TYPE_CHECKING:
    from collections.abc import Callable

    from guidedec.bitmask import HostRowChecker
    from guidedec.decoder.request import GuidedRequest
    from guidedec.decoder.stats import DecoderStats
    from guidedec.grammar.batch_fill import BatchFiller

Failure = tuple[int, str]
DEAD_END = "reached a grammar state that allows no token (dead end)"
SLOW_FILLS = 3
"""Fills in a row past ``mask_time_limit_ms`` (after a request's first) that fail it."""
_ROW_DISAGREES = "draft token {} is allowed by its bitmask row but its grammar rejects it"


class RequestError(GuidedecError):
    """Why one request cannot go on; collected by ``build``, never raised to the caller."""


class SlowMasksError(RequestError):
    """A guide's masks take longer than ``mask_time_limit_ms``: its request fails, and the
    factory forgets the guide (:meth:`GrammarMatcherFactory.forget`), since it would fail every
    request and its grammar state may have grown large."""


class RowFill:
    """A request whose rows ``build`` is filling: the next is ``row`` (``offset + position``)."""

    __slots__ = ("drafts", "matcher", "position", "req", "row")

    def __init__(
        self, req: GuidedRequest, matcher: GrammarMatcher, row: int, drafts: tuple[int, ...]
    ) -> None:
        self.req, self.matcher, self.row, self.drafts = req, matcher, row, drafts
        self.position = 0


class RowFilling:
    """The row-filling methods of the decoder (see the module docstring); what they read of the
    decoder is declared here."""

    bitmask_host: torch.Tensor
    stats: DecoderStats
    num_advanced_tokens: list[int]
    num_guided_tokens: list[int]
    is_draft_terminated: list[bool]
    _num_verifiable_tokens: list[int]
    _slow_fills: list[int]
    _fill_s: list[float]
    _filler: BatchFiller
    _row_is_valid: HostRowChecker
    _token_mask_words: memoryview
    _time_fills: bool
    _mask_limit_s: float  # inf without a limit
    _fail: Callable[[GuidedRequest, Exception, list[Failure]], None]
    """The decoder's: report a request's failure and drop its grammar state."""

    def _fill_wave(self, wave: list[RowFill], failures: list[Failure]) -> list[RowFill]:
        """Fill the current row of every request of the wave; returns the next wave.

        A wave too small for a parallel fill is finished request by request, each through all
        its rows (the waves after it would be no larger); this is the common case, kept lean.
        """
        next_wave: list[RowFill] = []
        if self._filler.one_by_one(len(wave)):
            for item in wave:
                try:
                    self._fill_request(item.req, item.matcher, item.row, item.drafts, item.position)
                except REQUEST_ERRORS as exc:
                    self._fail(item.req, exc, failures)
            return next_wave
        errors = self._filler.fill(
            [item.matcher for item in wave], self.bitmask_host, [item.row for item in wave]
        )
        for item, error in zip(wave, errors, strict=True):
            try:
                if error is not None:
                    raise error
                if self._after_fill(item):
                    next_wave.append(item)
            except REQUEST_ERRORS as exc:
                self._fail(item.req, exc, failures)
        return next_wave

    def _fill_request(
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
        slot, bitmask, mask = req.seq_slot, self.bitmask_host, self._token_mask_words
        row_is_valid = self._row_is_valid
        # HostRowChecker.allows inline: one call less per draft row.
        words, row_words, vocab = row_is_valid.flat, row_is_valid.row_words, row_is_valid.vocab_size
        unchecked = matcher.unchecked_advance
        timed = self._timed_fill if self._time_fills else None
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
                    self.is_draft_terminated[slot] = True
                    return
                raise RequestError(DEAD_END)
            mask[row] = 1
            guided += 1
            if position == last:
                break
            if not allowed:  # verification cannot accept the token: the row masks it out
                self._num_verifiable_tokens[slot] = position + 1
                break
            row += 1
            status = self._draft_row(matcher, token, row, slot, timed=timed is not None)
            if status == REJECTED:
                if unchecked:
                    raise RequestError(_ROW_DISAGREES.format(token))
                self._num_verifiable_tokens[slot] = position + 1
                break
            advanced += 1
            if status == TERMINATED:
                break
        self.num_advanced_tokens[slot] += advanced
        self.num_guided_tokens[slot] += guided
        self.stats.rows_filled += self.num_guided_tokens[slot]

    def _draft_row(
        self, matcher: GrammarMatcher, token: int, row: int, slot: int, *, timed: bool
    ) -> int:
        """Advance by a draft token, then fill the row after it (``row``); the status, as
        :meth:`GrammarMatcher.advance_and_fill` returns it."""
        if not timed:
            return matcher.advance_and_fill(token, self.bitmask_host, row)
        unchecked = matcher.unchecked_advance
        if not (matcher.advance(token) if unchecked else matcher.accept_token(token)):
            return REJECTED
        if matcher.is_terminated():
            return TERMINATED
        self._timed_fill(matcher, self.bitmask_host, row, slot)
        return FILLED

    def _timed_fill(
        self, matcher: GrammarMatcher, bitmask: torch.Tensor, row: int, slot: int
    ) -> None:
        """Fill one row, timed: a fill past ``mask_time_limit_ms`` counts against its request
        (its first fill excepted: it may build what later ones reuse); ``SLOW_FILLS`` in a row
        fail it. One slow fill, a stall of the machine, does not."""
        began = perf_counter()
        matcher.fill_next_token_bitmask(bitmask, row)
        took = perf_counter() - began
        self._fill_s[slot] += took
        limit = self._mask_limit_s
        slow = self._slow_fills[slot]
        if slow < 0 or took <= limit:
            self._slow_fills[slot] = 0
            return
        self._slow_fills[slot] = slow + 1
        if slow + 1 >= SLOW_FILLS:
            raise SlowMasksError(
                f"this guide's token masks take over {limit * 1e3:g} ms each ({took * 1e3:.0f} ms "
                f"the last, {SLOW_FILLS} in a row), past GuidedDecodingConfig.mask_time_limit_ms:"
                " it would slow every request of the batch"
            )

    def _accept_draft(self, matcher: GrammarMatcher, row: int, token: int) -> bool:
        """Advance by the draft token after row ``row``, just filled from the matcher's state:
        the row says whether the grammar accepts it, so a backend's cheaper unchecked accept
        (:meth:`GrammarMatcher.advance`) serves. False (state unchanged) when it is rejected."""
        if not matcher.unchecked_advance:
            return matcher.accept_token(token)
        if not self._row_is_valid.allows(row, token):
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
        req, row = item.req, item.row
        slot = req.seq_slot
        if not self._row_is_valid(row):
            if item.position == 0:
                if not req.is_draft:
                    raise RequestError(DEAD_END)
                self.is_draft_terminated[slot] = True
            self.stats.rows_filled += self.num_guided_tokens[slot]
            return False
        self._token_mask_words[row] = 1
        self.num_guided_tokens[slot] += 1
        position = item.position
        if position < len(item.drafts):
            if self._accept_draft(item.matcher, row, item.drafts[position]):
                self.num_advanced_tokens[slot] += 1
                if not item.matcher.is_terminated():
                    item.position, item.row = position + 1, row + 1
                    return True
            else:
                self._num_verifiable_tokens[slot] = position + 1
        self.stats.rows_filled += self.num_guided_tokens[slot]
        return False
