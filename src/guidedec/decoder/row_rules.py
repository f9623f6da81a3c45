"""Row rules: what guidedec adds to a backend's mask, per request, on every row of its output.

Two rules restrict rows beyond the grammar:

- **root types** (:class:`RootTypeRule`): under a JSON schema that xgrammar approximates, the
  rows before the output's first character that is not whitespace forbid the tokens that start
  a value of a type the schema excludes (see :mod:`guidedec.grammar.root_types`);
- **digit runs** (:class:`DigitRunRule`): under a JSON guide with budget-aware closing, once the
  output ends with ``MAX_DIGIT_RUN`` ASCII digits, a row forbids all-digit tokens where it
  allows anything else: a number that long has no meaning (float64 keeps 17 significant
  digits, int64 19), and a weak model otherwise writes digits until its budget runs out.

:meth:`RowRules.wrap` puts a request's rules around its matcher
(:class:`~guidedec.grammar.ruled.RuledMatcher`), so the rules see every token the matcher takes
and every rollback, and restrict every row it fills: a row sampled one at a time, a row verified
as a draft, a jump-forward row, a draft model's row and a row of the closing search decide
their allowed tokens the same way (greedy speculation is token for token plain decoding).

The rules that read a sampled token rather than a row (closing's check that a completion still
fits, steering's check of a settled value) and closing's forced witness rows act only where a
request proposes no drafts (:func:`guidedec.engine.speculative.draft_budget`), so they too see
every row one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from guidedec.decoder.closing import DigitTokens
from guidedec.grammar.matcher import GrammarMatcher
from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.grammar.root_types import RootTypes
from guidedec.grammar.ruled import RowRule, RuledMatcher
from guidedec.tokenizer import TokenizerInfo

MAX_DIGIT_RUN = 24
"""The most ASCII digits in a row that a JSON guided output under closing may hold (the row
after them allows no all-digit token, where it allows anything else)."""
_JSON_GUIDES = (GuideType.JSON_SCHEMA, GuideType.JSON_OBJECT)


@dataclass(slots=True)
class RuleStats:
    """What the rules did, summed over the decoder's life."""

    root_restricted: int = 0  # rows that lost tokens starting a value of an excluded root type
    digit_runs_cut: int = 0  # rows whose all-digit tokens were forbidden after a long run


class RootTypeRule:
    """One request's root-type restriction: active while its output holds whitespace only."""

    __slots__ = ("_accepted", "_closed_at", "_forbidden", "_stats", "_texts")

    def __init__(
        self, forbidden: npt.NDArray[np.int32], texts: tuple[str, ...], stats: RuleStats
    ) -> None:
        self._forbidden, self._texts, self._stats = forbidden, texts, stats
        self._accepted = 0
        self._closed_at: int | None = None  # tokens accepted when the root value started

    def advance(self, token: int) -> None:
        self._accepted += 1
        if self._closed_at is None:
            texts = self._texts
            if not (0 <= token < len(texts) and texts[token] and texts[token].isspace()):
                self._closed_at = self._accepted

    def rollback(self, num_tokens: int) -> None:
        self._accepted -= num_tokens
        if self._closed_at is not None and self._closed_at > self._accepted:
            self._closed_at = None

    def active(self) -> bool:
        return self._closed_at is None

    def restrict(self, words: npt.NDArray[np.int32]) -> None:
        kept = words & ~self._forbidden
        if kept.any() and not np.array_equal(kept, words):
            words[:] = kept
            self._stats.root_restricted += 1


class DigitRunRule:
    """One request's bound on digit runs: the run of ASCII digits the output ends with after
    each token it took (a stack, so that a rollback pops it)."""

    __slots__ = ("_digits", "_lengths", "_runs", "_stats")

    def __init__(self, digits: DigitTokens, lengths: list[int], stats: RuleStats) -> None:
        self._digits, self._lengths, self._stats = digits, lengths, stats
        self._runs = [0]

    def advance(self, token: int) -> None:
        runs = self._runs
        try:
            length = self._lengths[token] if token >= 0 else 0
        except IndexError:  # past the vocabulary: no text
            length = 0
        runs.append(runs[-1] + length if length else 0)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            del self._runs[-num_tokens:]

    def active(self) -> bool:
        return self._runs[-1] >= MAX_DIGIT_RUN

    def restrict(self, words: npt.NDArray[np.int32]) -> None:
        digits = self._digits
        kept = words & ~digits.words
        if (kept & digits.real_words).any() and not np.array_equal(kept, words):
            words[:] = kept
            self._stats.digit_runs_cut += 1


class RowRules:
    """Builds each request's row rules (from per-tokenizer tables, built once) and counts what
    they did (``stats``).

    Attributes:
        root_types: Whether the root-type rule applies (False: the backends' masks as they are
            at the root, a benchmark's baseline).
    """

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self.tokenizer = tokenizer
        self.stats = RuleStats()
        self.root_types = True
        self.roots = RootTypes(tokenizer)
        self._digits: tuple[DigitTokens, list[int]] | None = None

    def warm_up(self) -> None:
        """Build the tables the rules read now (about 0.2 s) rather than at a first request."""
        self.roots.warm_up()
        self._digit_tables()

    def rules(self, params: GuidedDecodingParams, backend: str, *, closing: bool) -> list[RowRule]:
        """The rules of a request with guide ``params`` on ``backend``, with budget-aware
        closing or not: fresh, as at the start of its output."""
        rules: list[RowRule] = []
        forbidden = self.roots.forbidden(params, backend) if self.root_types else None
        if forbidden is not None:
            rules.append(RootTypeRule(forbidden, self.roots.texts, self.stats))
        if closing and params.guide_type in _JSON_GUIDES:
            digits, lengths = self._digit_tables()
            rules.append(DigitRunRule(digits, lengths, self.stats))
        return rules

    def wrap(
        self, matcher: GrammarMatcher, params: GuidedDecodingParams, *, closing: bool
    ) -> GrammarMatcher:
        """``matcher`` (fresh, at the start of ``params``' guide) under its request's rules;
        the matcher itself where none applies."""
        rules = self.rules(params, matcher.backend, closing=closing)
        return RuledMatcher(matcher, rules) if rules else matcher

    def _digit_tables(self) -> tuple[DigitTokens, list[int]]:
        if self._digits is None:
            digits = DigitTokens.of(self.tokenizer)
            self._digits = (digits, digits.lengths.tolist())
        return self._digits
