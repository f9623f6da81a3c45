"""A matcher whose rows pass through row rules: the one place a row's allowed set is decided.

A guide's grammar is not always everything that decides which tokens a row allows. guidedec
adds rules of its own on top of a backend's mask (the decoder's
:class:`~guidedec.decoder.row_rules.RowRules` builds them): a JSON schema's root type where
xgrammar approximates it, a bound on runaway digit runs under budget-aware closing. Each rule
reads the tokens the output has taken, so it must follow the matcher exactly: a row verified as
a draft, a row after a jump-forward, a row of the closing search and a row sampled one at a
time must all see the same rule state, and a rollback must undo it.

:class:`RuledMatcher` makes that structural. It wraps the backend's matcher, tells each rule of
every token the matcher accepts and of every rollback, and has each rule restrict every row it
fills, whoever fills it (the decoder's build, its parallel waves through
:class:`~guidedec.grammar.batch_fill.BatchFiller`, the closing search, the vLLM plugin). The
invariant of speculative decoding extends to the rules: after every step, the rules' state is
that of fresh rules told exactly the accepted tokens.

A rule only ever removes tokens from a row, and never all of them: a row it would empty is
left as the grammar filled it. :meth:`RuledMatcher.accept_token` and :meth:`completes` answer
for the grammar alone (a rule's verdict on a token depends on the whole row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from guidedec.grammar.matcher import FILLED, REJECTED, GrammarMatcher, WrappedMatcher

Words = npt.NDArray[np.int32]


class RowRule(Protocol):
    """One rule's state for one request: told of each token and rollback, it restricts rows."""

    def advance(self, token: int) -> None:
        """The matcher accepted ``token`` (a stop token included)."""

    def rollback(self, num_tokens: int) -> None:
        """The matcher undid its last ``num_tokens`` tokens."""

    def active(self) -> bool:
        """Whether :meth:`restrict` may change a row in the current state (cheap: the hot
        path asks it at every fill)."""

    def restrict(self, words: Words) -> None:
        """Remove from ``words`` (a row just filled for the current state, int32 words) the
        tokens the rule forbids, unless that would leave no token allowed."""


class RuledMatcher(WrappedMatcher):
    """``inner`` with ``rules`` applied to every row it fills (see the module docstring)."""

    def __init__(self, inner: GrammarMatcher, rules: Sequence[RowRule]) -> None:
        super().__init__(inner)
        self.rules = tuple(rules)
        self.unchecked_advance = inner.unchecked_advance
        self._view: tuple[torch.Tensor | None, Words | None] = (None, None)
        # Bound once: the hot path calls these for every token and row.
        self._advances = tuple(rule.advance for rule in self.rules)
        self._actives = tuple((rule.active, rule.restrict) for rule in self.rules)

    def accept_token(self, token_id: int) -> bool:
        if not self.inner.accept_token(token_id):
            return False
        for advance in self._advances:
            advance(token_id)
        return True

    def advance(self, token_id: int) -> bool:
        if not self.inner.advance(token_id):
            return False
        for advance in self._advances:
            advance(token_id)
        return True

    def advance_and_fill(self, token_id: int, bitmask: torch.Tensor, index: int) -> int:
        status = self.inner.advance_and_fill(token_id, bitmask, index)
        if status != REJECTED:
            for advance in self._advances:
                advance(token_id)
            if status == FILLED:
                self.restrict_row(bitmask, index)
        return status

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
        for rule in self.rules:
            rule.rollback(num_tokens)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        self.inner.fill_next_token_bitmask(bitmask, index)
        self.restrict_row(bitmask, index)

    def completes(self, tokens: Sequence[int]) -> bool:
        """The grammar's answer (:meth:`GrammarMatcher.completes` of ``inner``): the rules
        state is left as it was, since the matcher's is."""
        return self.inner.completes(tokens)

    def restrict_row(self, bitmask: torch.Tensor, index: int) -> None:
        """Apply the rules to row ``index`` of ``bitmask``, just filled for the current state
        (by :meth:`fill_next_token_bitmask`, or by a batch fill of the inner matchers)."""
        words = None
        for active, restrict in self._actives:
            if active():
                if words is None:
                    words = self._words(bitmask)[index]
                restrict(words)

    def _words(self, bitmask: torch.Tensor) -> Words:
        """``bitmask`` as numpy words (the view is kept: one buffer is filled again and again)."""
        tensor, words = self._view
        if tensor is not bitmask or words is None:
            words = bitmask.numpy()
            self._view = (bitmask, words)
        return words


def batch_member(matcher: GrammarMatcher) -> GrammarMatcher:
    """The matcher whose class fills ``matcher``'s rows in a batch call: the one under its
    rules (:meth:`RuledMatcher.restrict_row` then applies them to the row), else itself."""
    return matcher.inner if isinstance(matcher, RuledMatcher) else matcher
