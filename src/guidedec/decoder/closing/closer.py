"""Budget-aware closing: a guided output ends complete within its token budget.

A request that carries ``tokens_left`` (the tokens it may still emit, the one sampled from this
row included) gets, near the end of its budget, a *witness* for its current grammar state: a
short completion that ends with a stop token, found through the matcher API by
:class:`guidedec.decoder.closing.CompletionSearch`. While the witness leaves more than
``margin`` tokens of room the row keeps the grammar's mask and the model writes what it wants;
once it does not, the row allows the witness's next token only, and the output follows the
witness to its stop token. A witness stays valid while the output follows it, so a forced step
costs no search. The engine checks each token the model samples inside the window
(:meth:`BudgetCloser.admits`): one after which no completion fits is drawn again without it,
and after ``MAX_RESAMPLES`` such draws the witness's next token is taken. So the engine needs no
margin and forces no row (``margin`` 0): the model keeps every choice of its own after which a
completion fits, and only the tokens no choice of its could replace are the witness's. A logits
processor, which cannot draw again, forces rows within ``MARGIN``.

Before it searches, the closer replays the witnesses it found lately for the same guide
(``RECENT_KEPT``): the outputs of one guide pass through the same states, and a replay is exact
(the matcher accepts the witness and ends with it) and costs no mask fill.

Where the checks start: at the guide's window, ``WINDOW`` tokens before the end of the budget,
or more for a guide that can commit an output to more than that (:meth:`BudgetCloser.window`,
from its reach: :func:`guidedec.grammar.schema_reach.guide_reach`). No search and no check runs
before the window. Inside it every sampled token is checked, string content included: a token
inside a property name or an enum string chooses among the names or values that begin with it,
and that choice can commit the output to a long value (a required array with ``minItems``). A
token before the window cannot take the output farther from its end than the guide's reach,
which the window holds, so the output enters the window with a completion that fits. What the
reach does not count is nesting the model opens itself (a free-form value, a recursive
reference or rule taken again: one level is counted), and a Lark guide's structure
(``WINDOW``): a token before the window that commits the output through those to more than it
has left still ends it ``length``.

Cost bounds: the witness of a guide's initial state is kept, and tried first at every output's
start; a search expands at most ``8 * min(tokens_left, MAX_DEPTH) + 16`` states
(:data:`guidedec.decoder.closing.settings.MAX_DEPTH`).
A request for which no witness fits is searched no more (its output ends ``length``, with a
note); a guide whose initial state had none within N tokens is not searched again from there
with at most N left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

import guidedec.decoder.closing.settings as settings
from guidedec.bitmask.layout import token_word
from guidedec.decoder.closing.search import completes
from guidedec.decoder.closing.stats import ClosingStats
from guidedec.decoder.closing.vocab import ClosingVocab
from guidedec.decoder.closing.witness import Witnesses, replayed
from guidedec.decoder.request import GuidedRequest
from guidedec.grammar.matcher import GrammarMatcher
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.tokenizer import TokenizerInfo


@dataclass(slots=True)
class _SlotState:
    witness: list[int] | None = None  # from the state of the last closed row, its token first
    after: tuple[int, list[int]] | None = None  # a checked sampled token and the witness after it
    next_search: int = settings.WINDOW  # search again once tokens_left is at most this
    window: int = settings.WINDOW  # the guide's window (see BudgetCloser.window)
    incomplete: bool = False
    moved: bool = False  # the matcher moved by more than the row's token since the witness
    guide: GuidedDecodingParams | None = None  # the params ``window`` was read from
    forced_left: int | None = None  # tokens_left at the last row forced to the witness


class BudgetCloser:
    """Per sequence slot: the witness of its last row and when to search again.

    Args:
        tokenizer: The tokenizer of the slots' matchers.
        num_slots: The decoder's sequence slots.
        margin: Room a witness must leave for the row to keep the grammar's mask; with less the
            row is forced to the witness. ``MARGIN`` where nothing checks the sampled token (a
            logits processor); the engine sets 0: it checks every token sampled inside the
            window (:meth:`admits`) and takes the witness's next token only when no draw leaves
            a completion that fits (:meth:`fallback`), so the model keeps each choice of its own
            that fits, a value's digits and words included.
    """

    def __init__(
        self, tokenizer: TokenizerInfo, num_slots: int, *, margin: int = settings.MARGIN
    ) -> None:
        self.tokenizer, self.num_slots, self.margin = tokenizer, num_slots, margin
        self.stats = ClosingStats()
        self.witnesses = Witnesses(tokenizer, self.stats)
        self._slots = [_SlotState() for _ in range(num_slots)]

    @property
    def sized_windows(self) -> bool:
        """False: every guide's window is ``WINDOW`` (a benchmark's baseline)."""
        return self.witnesses.sized_windows

    @sized_windows.setter
    def sized_windows(self, sized: bool) -> None:
        self.witnesses.sized_windows = sized

    def window(self, params: GuidedDecodingParams) -> int:
        """The guide's window (see :meth:`Witnesses.window`)."""
        return self.witnesses.window(params)

    def warm_up(self) -> None:
        """Build the per-tokenizer table closing reads (the decoded vocabulary, ~1 s) now
        rather than at a first guided row, beside running requests."""
        self.witnesses.warm_up()

    def vocab(self) -> ClosingVocab:
        """The decoded vocabulary the search reads (built at first use, ~1 s)."""
        return self.witnesses.vocab()

    def acts_within(self, slot: int, tokens_left: int, num_tokens: int) -> bool:
        """Whether closing may act on any of the slot's next ``num_tokens + 1`` rows, with
        ``tokens_left`` at the first: a row inside the guide's window (its sampled token is
        checked, see :meth:`checks`), a search falls due, or a witness is close to being
        forced. Speculative decoding proposes no drafts then: a verified draft token would
        skip the check, and a forced row would not be forced."""
        state = self._slots[slot]
        last = tokens_left - num_tokens
        if last <= state.next_search or (last <= state.window and not state.incomplete):
            return True
        return (
            state.witness is not None and len(state.witness) > last - settings.MARGIN - num_tokens
        )

    def forget(self, slot: int) -> None:
        """The slot's request ended or its matcher was created anew."""
        self._slots[slot] = _SlotState()

    def move(self, source: int, target: int, *, swap: bool) -> None:
        """The request at slot ``source`` now holds ``target`` (see
        :meth:`~guidedec.decoder.slots.SlotState.move`): its witness goes with it."""
        slots = self._slots
        slots[source], slots[target] = slots[target], slots[source]
        if not swap:
            slots[source] = _SlotState()

    def moved(self, slot: int) -> None:
        """The slot's matcher moved by more than its row's token (verified drafts, a rollback of
        rejected ones): its witness is replayed against the new state before any use, and what
        was learned about its distance to a completion (no search again after a failed one)
        is kept, since a search costs its whole budget."""
        state = self._slots[slot]
        state.after, state.moved = None, True

    def close(self, req: GuidedRequest, matcher: GrammarMatcher, words: npt.NDArray[Any]) -> None:
        """Restrict the request's row (``words``: its int32 words, just filled for the matcher's
        current state) to the witness's next token when the budget requires it."""
        left = req.tokens_left
        assert left is not None
        state = self._slots[req.seq_slot]
        if req.guided_decoding_params is not state.guide:
            self._meet(req.guided_decoding_params, state)
        if state.witness is None and state.after is None and left > state.next_search:
            state.moved = False
            return  # before the window (or between searches with no witness): nothing to do
        witness, after = state.witness, state.after
        state.after = None
        if state.moved:
            state.moved = False
            witness = replayed(matcher, state.witness, left)
        elif after is not None and after[0] == req.new_token:
            witness = after[1]  # found when the token was checked (see admits)
        elif witness and len(witness) > 1 and req.new_token == witness[0]:
            witness = witness[1:]  # the output followed the witness: still valid
        else:
            witness = replayed(matcher, state.witness, left)
            if witness is None and req.new_token is not None:
                witness = self.witnesses.respelled(matcher, state.witness, req.new_token, left)
        if witness is None:
            if left > state.next_search:
                state.witness = None
                return
            params = req.guided_decoding_params
            assert params is not None
            start = req.new_token is None and not req.refill  # the guide's initial state
            memo = self.witnesses.memo(params)
            if start and memo.start_no_fit >= left:
                witness = None  # this guide's start had no completion within as many tokens
            else:
                witness = self.witnesses.find(params, matcher, left, start=start)
            if witness is None:
                # Searched once: a failed search costs its whole budget, and the distance to a
                # completion seldom shrinks unless the model closes what it opened itself.
                state.witness, state.incomplete, state.next_search = None, True, -1
                if start:
                    memo.start_no_fit = max(memo.start_no_fit, left)
                if self.witnesses.gave_up:
                    self.stats.searches_given_up += 1
                else:
                    self.stats.no_fit += 1
                return
            state.incomplete = False
            room = left - len(witness)
            state.next_search = left - max(0, room - settings.MARGIN) // 3
        state.witness = witness
        if len(witness) > left - self.margin:
            token = witness[0]
            words[:] = 0
            words[token >> 5] = token_word(token)
            state.forced_left = left
            self.stats.forced_rows += 1

    def forced_next(self, req: GuidedRequest) -> int | None:
        """The one token the request's coming row will allow, when that is known before the
        row is filled: the output took the witness's next token (or the token :meth:`admits`
        checked), and the rest of the witness leaves no room, so :meth:`close` would overwrite
        the filled row with that rest's first token. The slot moves on as :meth:`close` would;
        the caller advances the matcher by ``new_token``, writes the one-token row instead of
        filling it, and does not call :meth:`close` for it. None: fill, then :meth:`close`."""
        state = self._slots[req.seq_slot]
        token, left = req.new_token, req.tokens_left
        if state.moved or token is None or left is None:
            return None
        after, witness = state.after, state.witness
        if after is not None and after[0] == token:
            rest = after[1]
        elif witness and len(witness) > 1 and token == witness[0]:
            rest = witness[1:]
        else:
            return None
        if not rest or len(rest) <= left - self.margin:
            return None
        if req.guided_decoding_params is not state.guide:
            self._meet(req.guided_decoding_params, state)
        state.after, state.witness, state.forced_left = None, rest, left
        self.stats.forced_rows += 1
        return rest[0]

    def _meet(self, params: GuidedDecodingParams | None, state: _SlotState) -> None:
        """Read the guide of the slot's request at its first row: its window (the first search
        falls due there)."""
        fresh = state.guide is None
        state.guide = params
        state.window = settings.WINDOW if params is None else self.witnesses.window(params)
        if fresh:
            state.next_search = max(state.next_search, state.window)

    def checks(self, slot: int, tokens_left: int) -> bool:
        """Whether a token sampled for the slot's last closed row, with ``tokens_left`` at that
        row, should go through :meth:`admits`: inside the guide's window, unless no witness
        fitted (the output ends ``length`` anyway). A token the row was forced to, or the
        witness's next one, costs no search there (its rest is the witness)."""
        state = self._slots[slot]
        return tokens_left <= state.window and not state.incomplete

    def admits(
        self,
        slot: int,
        matcher: GrammarMatcher,
        params: GuidedDecodingParams,
        token: int,
        tokens_left: int,
    ) -> bool:
        """Whether the output can still complete within its budget after ``token``, sampled
        from the row of the matcher's current state (the matcher is left as it was). One token
        can commit the output to a long completion (``,`` before a further tool call): the
        engine samples again without it when it cannot."""
        state = self._slots[slot]
        witness = state.witness
        if witness and witness[0] == token and not state.moved:
            state.after = (token, witness[1:])
            return True
        if matcher.is_terminated():
            return True
        room = self.witnesses.think_room(params, witness)
        tried = False  # most tokens leave the witness as it was (string content)
        if witness and len(witness) + room < tokens_left:
            tried = True
            if completes(matcher, [token, *witness]):  # one call checks both
                state.after = (token, witness)
                return True
        if not matcher.accept_token(token):
            return True  # nothing to check: the build reports a rejected token
        try:
            if matcher.is_terminated():
                return True
            found = replayed(matcher, witness, tokens_left - 1, first=int(tried))
            if found is None:
                found = self.witnesses.respelled(matcher, witness, token, tokens_left - 1)
            if found is None:
                found = self.witnesses.find(params, matcher, tokens_left - 1)
        finally:
            matcher.rollback(1)
        if found is None or len(found) + self.witnesses.think_room(params, found) > tokens_left - 1:
            self.stats.resampled += 1
            return False
        state.after = (token, found)
        return True

    def fallback(self, slot: int, tokens_left: int) -> int | None:
        """The witness's next token for the slot's current state (its row, with ``tokens_left``
        at it, counts as forced: see :meth:`forced_at`), if one is known."""
        state = self._slots[slot]
        if not state.witness or state.moved:
            return None
        state.forced_left = tokens_left
        return state.witness[0]

    def forced_at(self, slot: int) -> int | None:
        """``tokens_left`` at the slot's last row that closing forced to its witness's next
        token (the budget, not the model, chose that token), or None. A request's output is
        forced from the first such row on: closing then follows the witness to its end."""
        return self._slots[slot].forced_left
