"""Budget-aware closing: a guided output ends complete within its token budget.

The decoder's build asks :class:`BudgetCloser` to restrict a row (:meth:`BudgetCloser.close`,
:meth:`BudgetCloser.forced_next`); the engine asks it to check a sampled token
(:meth:`BudgetCloser.admits`, :meth:`BudgetCloser.fallback`). Underneath, :mod:`.witness` finds
witnesses (kept, replayed, respelled or searched), :mod:`.search` searches through the matcher
API, and :mod:`.vocab` holds what the search knows of a tokenizer. See :mod:`.closer` for the
whole behaviour.
"""

from guidedec.decoder.closing.closer import BudgetCloser
from guidedec.decoder.closing.search import CompletionSearch, completes
from guidedec.decoder.closing.settings import MARGIN, THINK_ROOM, WINDOW
from guidedec.decoder.closing.stats import ClosingStats
from guidedec.decoder.closing.vocab import ClosingVocab, DigitTokens

__all__ = [
    "MARGIN",
    "THINK_ROOM",
    "WINDOW",
    "BudgetCloser",
    "ClosingStats",
    "ClosingVocab",
    "CompletionSearch",
    "DigitTokens",
    "completes",
]
