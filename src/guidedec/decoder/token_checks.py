"""What an engine that samples its own tokens asks the decoder about a sampled token: the
decoder's side of budget-aware closing (:mod:`guidedec.decoder.closing`) by sequence slot, so
that the engine never handles a slot's matcher or closer itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from guidedec.decoder.closing import BudgetCloser
    from guidedec.grammar.matcher import GrammarMatcher
    from guidedec.grammar.params import GuidedDecodingParams


class TokenChecks:
    """The checks of tokens sampled from a decoder's rows, by slot.

    Args:
        matchers: The decoder's matcher per slot (``SlotState.matchers``).
        closer: The decoder's closer, read at each call.
    """

    def __init__(
        self, matchers: Sequence[GrammarMatcher | None], closer: Callable[[], BudgetCloser]
    ) -> None:
        self._matchers, self._closer = matchers, closer

    def backend(self, slot: int) -> str | None:
        """The backend of the slot's matcher; None when the slot has none (no guided request,
        its grammar failed)."""
        matcher = self._matchers[slot]
        return None if matcher is None else matcher.backend

    def closes(self, slot: int, tokens_left: int) -> bool:
        """Whether a token sampled for the slot's last row, ``tokens_left`` at that row, goes
        through :meth:`admits` (see :meth:`BudgetCloser.checks`)."""
        return self._closer().checks(slot, tokens_left)

    def admits(self, slot: int, params: GuidedDecodingParams, token: int, tokens_left: int) -> bool:
        """Whether the slot's output can still complete within its budget after ``token``
        (see :meth:`BudgetCloser.admits`)."""
        matcher = self._matchers[slot]
        assert matcher is not None
        return self._closer().admits(slot, matcher, params, token, tokens_left)

    def fallback(self, slot: int, tokens_left: int) -> int | None:
        """The witness's next token when no draw is admitted (:meth:`BudgetCloser.fallback`)."""
        return self._closer().fallback(slot, tokens_left)

    def forced_at(self, slot: int) -> int | None:
        """``tokens_left`` at the last row closing forced (:meth:`BudgetCloser.forced_at`)."""
        return self._closer().forced_at(slot)

    def acts_within(self, slot: int, tokens_left: int, num_tokens: int) -> bool:
        """Whether closing may act on the slot's next ``num_tokens + 1`` rows (no drafts then:
        :meth:`BudgetCloser.acts_within`)."""
        return self._closer().acts_within(slot, tokens_left, num_tokens)

    def structural(self) -> npt.NDArray[np.bool_]:
        """Per token id: whether its text holds a JSON structural character."""
        return self._closer().vocab().structural
