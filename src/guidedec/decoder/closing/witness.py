"""Finding witnesses for budget-aware closing: a kept one of the guide's, the previous one
replayed or respelled after the token the model took, or a new search's
(:class:`guidedec.decoder.closing.search.CompletionSearch`); and what is kept per guide and per
tokenizer to make that cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import guidedec.decoder.closing.settings as settings
from guidedec.decoder.closing.search import CompletionSearch, completes
from guidedec.decoder.closing.stats import ClosingStats
from guidedec.decoder.closing.vocab import ClosingVocab
from guidedec.grammar.cache import guide_cache_key
from guidedec.grammar.guide_words import guide_words
from guidedec.grammar.matcher import GrammarMatcher
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.grammar.schema_reach import MAX_REACH, guide_reach
from guidedec.kept import Kept
from guidedec.tokenizer import TokenizerInfo


@dataclass(slots=True)
class _GuideMemo:
    """What closing learned of one guide."""

    words: list[int] | None = None  # its words (guide_words), read at its first search
    recent: list[list[int]] = field(default_factory=list)  # witnesses found lately
    start: list[int] | None = None  # a witness of its initial state
    start_no_fit: int = 0  # most tokens its initial state had no witness within
    window: int | None = None  # see BudgetCloser.window


class Witnesses:
    """Finds witnesses for the matchers of one tokenizer, keeping per guide its words, window,
    the witness of its initial state and its recent witnesses.

    Args:
        tokenizer: The tokenizer of the matchers.
        stats: The closer's counters, which the searches add to.
    """

    def __init__(self, tokenizer: TokenizerInfo, stats: ClosingStats) -> None:
        self.tokenizer, self.stats = tokenizer, stats
        self.sized_windows = True  # False: every guide's window is WINDOW (a benchmark's baseline)
        self._search: CompletionSearch | None = None
        self._guides: Kept[object, _GuideMemo] = Kept(settings.GUIDES_KEPT)  # by the guide's key
        self._keys: Kept[int, tuple[GuidedDecodingParams, object]] = Kept(settings.KEYS_KEPT)
        self._encodings: Kept[str, list[int]] = Kept(
            settings.ENCODINGS_KEPT
        )  # text -> its token ids

    @property
    def gave_up(self) -> bool:
        """The last search stopped: its masks were too slow."""
        return self._search is not None and self._search.gave_up

    def window(self, params: GuidedDecodingParams) -> int:
        """Tokens left from which the outputs of a guide are searched and checked: ``WINDOW``,
        or more for a guide whose reach (:func:`guidedec.grammar.schema_reach.guide_reach`,
        counted in this tokenizer's tokens) is longer, so that no token before the window can
        commit an output to more than it has left."""
        if not self.sized_windows:
            return settings.WINDOW
        memo = self.memo(params)
        if memo.window is None:
            reach = guide_reach(params, lambda text: len(self.encoded(text)))
            if reach is None or reach >= MAX_REACH:  # unknown, or no finite completion seen
                memo.window = settings.WINDOW
            else:
                memo.window = max(settings.WINDOW, reach + settings.MARGIN + 1)
        return memo.window

    def warm_up(self) -> None:
        """Build the per-tokenizer table closing reads (the decoded vocabulary, ~1 s) now
        rather than at a first guided row, beside running requests."""
        self.vocab()

    def vocab(self) -> ClosingVocab:
        """The decoded vocabulary the search reads (built at first use, ~1 s)."""
        if self._search is None:
            self._search = CompletionSearch(self.tokenizer)
        return self._search.vocab

    def think_room(self, params: GuidedDecodingParams, witness: list[int] | None) -> int:
        """``THINK_ROOM`` where ``witness`` opens a ``think_first`` value (the output is in its
        free text), else 0."""
        opener = params.answer_opener
        if opener is None or not witness:
            return 0
        encoded = self.encoded(opener)
        return settings.THINK_ROOM if len(encoded) == 1 and witness[0] == encoded[0] else 0

    def respelled(
        self, matcher: GrammarMatcher, witness: list[int] | None, token: int, limit: int
    ) -> list[int] | None:
        """The previous witness's text after what ``token`` (just accepted) wrote of it, encoded
        again, when it completes the matcher's state within ``limit`` tokens (left as it was).
        The model often writes the witness's text in another split into tokens (``da`` where
        the witness had ``data``), whitespace around one of its structural characters (``{``
        and a newline where it had ``{"``), or a structural character after content of its own
        or before the witness's (``"`` where it had ``0"``): a replay of the witness's tokens
        misses all of these (:func:`_rests` lists where the output may stand), and a search
        costs twenty times as much as this."""
        if not witness or len(witness) < 2:
            return None
        texts = self.vocab().texts
        try:
            written = texts[token]
            text = "".join([texts[t] for t in witness[:-1]])
        except IndexError:  # a token past the tokenizer's own (padding): no text
            return None
        if "\ufffd" in written or "\ufffd" in text:
            return None  # a piece of a character: the texts do not line up
        for rest in rests(written, text):
            candidate = [*self.encoded(rest), witness[-1]] if rest else witness[-1:]
            if len(candidate) <= limit and completes(matcher, candidate):
                self.stats.respelled += 1
                return candidate
        return None

    def encoded(self, text: str) -> list[int]:
        """``text``'s token ids; the rests a respelling encodes recur (``":""}``)."""
        known = self._encodings.get(text)
        if known is None:
            known = self._encodings.put(text, self.tokenizer.encode(text))
        return known

    def find(
        self, params: GuidedDecodingParams, matcher: GrammarMatcher, left: int, start: bool = False
    ) -> list[int] | None:
        """A witness within ``left`` tokens: a kept one of the guide's (its initial state's
        first when ``start``: every output of a guide begins there) that completes the
        matcher's state, else a search's."""
        if self._search is None:
            self._search = CompletionSearch(self.tokenizer)
        self._search.gave_up = False
        if left < 1:
            return None
        memo = self.memo(params)
        if memo.words is None:
            memo.words = guide_words(params, self.tokenizer)
        recent = memo.recent
        first = memo.start if start else None
        if first is not None and len(first) <= left and completes(matcher, first):
            self.stats.recent_hits += 1
            return first
        for known in recent:  # another output of the guide was here (or somewhere like it)
            if len(known) + settings.RECENT_SLACK <= left and completes(matcher, known):
                self.stats.recent_hits += 1
                return known
        began = time.perf_counter()
        witness = self._search.witness(matcher, left, words=memo.words)
        self.stats.searches += 1
        self.stats.nodes += self._search.nodes
        if witness is None and params.answer_opener is not None:
            witness = self.after_opener(params.answer_opener, matcher, left, memo.words)
        self.stats.search_s += time.perf_counter() - began
        if witness is not None and start:
            memo.start = witness
        if witness is not None and witness not in recent:
            recent.insert(0, witness)
            del recent[settings.RECENT_KEPT :]
        return witness

    def after_opener(
        self, opener: str, matcher: GrammarMatcher, left: int, words: list[int]
    ) -> list[int] | None:
        """A ``think_first`` guide's witness from its free text: the value's opener, then a
        search's completion of the value (the search proper finds none there: every token of
        free text leads back to the same state, and it prunes them all as cycles)."""
        assert self._search is not None
        encoded = self.encoded(opener)
        if len(encoded) != 1 or left < 2 or not matcher.accept_token(encoded[0]):
            return None
        try:
            rest = self._search.witness(matcher, left - 1, words=words)
            self.stats.nodes += self._search.nodes
        finally:
            matcher.rollback(1)
        return None if rest is None else [encoded[0], *rest]

    def memo(self, params: GuidedDecodingParams) -> _GuideMemo:
        """What closing keeps of the guide, made at its first use."""
        key = self._key(params)
        memo = self._guides.get(key)
        if memo is None:
            memo = self._guides.put(key, _GuideMemo())
        return memo

    def _key(self, params: GuidedDecodingParams) -> object:
        """The guide's cache key (the requests of one guide often share their params)."""
        known = self._keys.get(id(params))
        if known is not None and known[0] is params:
            return known[1]
        return self._keys.put(id(params), (params, guide_cache_key(params)))[1]


def replayed(
    matcher: GrammarMatcher, witness: list[int] | None, limit: int, first: int = 0
) -> list[int] | None:
    """The previous witness (or the rest of it after its first few tokens, from ``first`` on)
    when it still completes the matcher's state within ``limit`` tokens: a sampled token inside
    a string or a number seldom changes how the output can end, and a replay costs no mask
    fill. The matcher is left as it was."""
    if not witness:
        return None
    for skip in range(first, min(settings.REPLAY_SKIPS, len(witness)) + 1):
        candidate = witness[skip:]
        if not candidate or len(candidate) > limit:
            continue
        if completes(matcher, candidate):
            return candidate
    return None


def rests(written: str, text: str) -> list[str]:
    """Where the output may stand in the witness's ``text`` after a token that wrote
    ``written``, as the rest of ``text`` from there, likeliest first: ``written`` (or it without
    surrounding whitespace) is how ``text`` begins; else it is found further on (the model left
    out what the witness had before it: ``"`` for ``0"}``); else its end is how ``text`` begins
    (``="`` for ``"}``: what came before went into a string)."""
    solid = written.strip()
    if text.startswith(written):
        return [text[len(written) :]]
    if not solid:
        return []
    if text.startswith(solid):
        return [text[len(solid) :]]
    rests = []
    at = text.find(solid)
    if at > 0:
        rests.append(text[at + len(solid) :])
    for cut in range(1, len(solid)):
        if text.startswith(solid[cut:]):
            rests.append(text[len(solid) - cut :])
            break
    return rests
