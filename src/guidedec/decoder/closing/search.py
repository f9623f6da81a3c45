"""Short completions of a grammar state, found through the matcher API alone.

Budget-aware closing needs, at a request's current state, a way to finish the guide in few
tokens: a *witness*, a token sequence that the grammar accepts and that ends with a stop token.
Neither backend exposes the grammar's structure or a shortest-completion query, so the search
runs on what every matcher offers: fill the state's mask, accept a token, roll back.

A *probe* runs first, and finds most witnesses without reading a mask: from each state it
accepts a stop token if it can, else the first token the matcher accepts among a short list of
one-character candidates (closers, separators, openers, ``0``) and the guide's words, reading
the state's mask only where none of them is accepted; the text it spelled is then encoded
again (``"`` ``,`` ``"`` becomes ``","``) where the grammar accepts that. A try costs one
``accept_token`` (about 1 µs), a mask fill and the choice among its tokens about 50 µs. Where
the probe runs into a dead end or a cycle, the search proper runs:

The search is a depth-first search with backtracking over a few preferred tokens per state:

- a state whose mask allows a stop token is complete (the witness ends there);
- otherwise the allowed tokens are tried in a fixed preference order (``preference_order``,
  computed once per tokenizer over its short printable tokens): closers (``"``, ``}``, ``]``,
  ``)``, ``'``, ``>``; an empty string ``""`` first, ``}]`` before ``},``), one-token structure
  (``{"``, ``,"``, ``[]``), separators, then the guide's own words (``guide_words``: its
  property names, literals and their rests, format examples), digits (``0`` first), other
  tokens (longest first), tokens that open brackets, whitespace only where nothing else is
  allowed; one token per kind (its first character; digits are one kind), at most
  ``PER_STATE`` of them, and ``BRANCHES`` failed subtrees per state;
- a token after which the mask is unchanged (content of a string, more digits) is pruned, and
  so is a token cycle that leads back to the mask it started from (``ab ab`` under ``(ab)*c``);
- at most ``limit`` tokens deep and ``max_nodes`` expansions in all: the preferred path first,
  then iterative deepening (which gets around a cycle the preferred tokens run into), then the
  preferred path with cycles and unchanged masks allowed (``minItems: 50`` counts where the
  mask cannot show it, and so do copies of one literal).
  The search returns None when it finds no witness within them, and the caller treats that as
  "no completion fits".

The witness is short, not always the shortest: the preference order closes what is open before
it opens anything, which on JSON, regex, EBNF and choice guides finds completions close to the
shortest. Each expansion costs one mask fill (about 10 µs at V = 129,280) and the choice of its
candidates (about 40 µs in all); the matcher is back in its state when the search returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

import guidedec.decoder.closing.settings as settings
from guidedec.bitmask.layout import allocate_bitmask
from guidedec.decoder.closing.vocab import WORD_KINDS, ClosingVocab
from guidedec.grammar.matcher import GrammarMatcher
from guidedec.tokenizer import TokenizerInfo


def completes(matcher: GrammarMatcher, tokens: Sequence[int]) -> bool:
    """Whether the matcher accepts ``tokens`` and ends the guide with them (left as it was):
    :meth:`GrammarMatcher.completes`, one native call on either backend."""
    return matcher.completes(tokens)


class CompletionSearch:
    """Finds witnesses for matchers of one tokenizer (a scratch bitmask of its own)."""

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self.vocab = ClosingVocab.of(tokenizer)
        self._tokenizer = tokenizer
        self._rows = torch.empty(0)
        self.nodes = 0  # expansions of the last search
        self.tries = 0  # tokens its probe tried
        self.gave_up = False  # the last search stopped: its masks were too slow (SLOW_SEARCH_S)
        self._began = 0.0
        self._fingerprints: list[int] = []  # the masks along the path (the root's first)
        self._budget = self._limit = 0
        self._prune_cycles = True
        self._order: tuple[Any, ...] = ()
        self._orderings: dict[tuple[int, ...], tuple[Any, ...]] = {}

    def witness(
        self,
        matcher: GrammarMatcher,
        limit: int,
        *,
        words: Sequence[int] = (),
        max_nodes: int | None = None,
        probe: bool = True,
    ) -> list[int] | None:
        """A completion of at most ``limit`` tokens that ends with a stop token, or None; the
        matcher is left in its state. ``words``: the guide's own tokens (its property names
        and literals, see ``guide_words``), tried right after the closers; ``max_nodes``
        bounds the expansions (default ``8 * min(limit, MAX_DEPTH) + 16``); ``probe=False``
        skips the probe (the search proper reads a mask at every state)."""
        if matcher.is_terminated() or limit < 1:
            return None
        self._order = self._ordering(tuple(words))
        deepest = min(limit, settings.MAX_DEPTH)
        if self._rows.shape[0] < deepest + 1:
            self._rows = allocate_bitmask(deepest + 1, self.vocab.vocab_size)
        total = 8 * deepest + 16 if max_nodes is None else max_nodes
        self.nodes, self.gave_up, self._began = 0, False, perf_counter()
        probed = self._probe(matcher, limit) if probe else None
        if probed is not None:
            return probed
        # The preferred path first, as deep as allowed; then iterative deepening, which gets
        # around a cycle the preferred tokens run into (``(ab)*c``: "ab" forever); both prune
        # cycles. Last, the preferred path again with cycles and unchanged masks allowed: some
        # guides need them (``minItems: 50`` counts where the mask cannot show it, and so does
        # a literal the output stands inside: ``("aaaaaaaa")*`` after 17 a's).
        passes = [(deepest, 2 * deepest + 8, True)]
        passes += [(d, 4 * d, True) for d in settings.DEEPENING if d < deepest]
        passes.append((deepest, total, False))
        for depth, share, prune in passes:
            if self.nodes >= total or self.gave_up:
                break
            self._limit, self._budget = depth, min(total, self.nodes + share)
            self._prune_cycles = prune
            path: list[int] = []
            try:
                found = self._search(matcher, path, 0)
            except RecursionError:  # a caller deep in its own stack: give up, state restored
                matcher.rollback(len(path))
                return None
            if found is _FOUND:
                return path
        return None

    def _too_slow(self) -> bool:
        """Whether the search has run past ``settings.SLOW_SEARCH_S`` on slow masks (it then
        gives up: ``gave_up``)."""
        took = perf_counter() - self._began
        if took > settings.SLOW_SEARCH_S and took > self.nodes * settings.SLOW_NODE_S:
            self.gave_up = True
        return self.gave_up

    def _probe(self, matcher: GrammarMatcher, limit: int) -> list[int] | None:
        """A completion found by trying tokens (accept, roll back) instead of reading masks: at
        each state a stop token if one is accepted, else the first accepted of the probe's
        ``PROBE_CANDIDATES`` candidates (the one-character closers, separators, openers and
        ``0`` of ``PROBE_FIRST``, then the guide's words); a state that accepts none of them
        has its mask read and takes its first preferred token. Right after an opener its
        closer comes first (``[]`` before ``[""]``). The text is then encoded again
        (``"`` ``,`` ``"`` ``a`` becomes ``",`` ``"a``) where the grammar accepts that. None at
        a state that allows no candidate, past ``PROBE_TRIES`` tries per token of ``limit`` (a
        cycle) or ``2 * limit`` mask reads, or when the completion does not fit ``limit``: the
        search proper runs then. The matcher is left in its state."""
        candidates = self._order[5][: settings.PROBE_CANDIDATES]
        stops, closer_of = self.vocab.stop_token_ids, self.vocab.closer_of
        path: list[int] = []
        tries, most = 0, settings.PROBE_TRIES * limit
        found: int | None = None
        try:
            while tries <= most and found is None:
                for stop in stops:
                    tries += 1
                    if matcher.accept_token(stop):
                        matcher.rollback(1)
                        found = stop
                        break
                if found is not None:
                    break
                closer = closer_of.get(path[-1]) if path else None  # an empty [] or {} first
                for token in candidates if closer is None else [closer, *candidates]:
                    tries += 1
                    if matcher.accept_token(token):
                        path.append(token)
                        break
                else:  # a rarer token (inside a key, a pattern): read the state's mask
                    if self.nodes >= 2 * limit or self._too_slow():
                        break  # masks at most at 2 * `limit` states: the probe stays bounded
                    self.nodes += 1
                    matcher.fill_next_token_bitmask(self._rows, 0)
                    preferred = self._preferred(self._rows[0].numpy())
                    if not preferred or not matcher.accept_token(preferred[0]):
                        break
                    path.append(preferred[0])
        finally:
            self.tries = tries
            if path:
                matcher.rollback(len(path))
        if found is None:
            return None
        witness = [*path, found]
        if len(path) > 1:
            merged = [*self._tokenizer.encode(self._tokenizer.decode(path)), found]
            if len(merged) < len(witness) and completes(matcher, merged):
                witness = merged
        return witness if len(witness) <= limit else None

    def _ordering(self, words: tuple[int, ...]) -> tuple[Any, ...]:
        """The candidates with ``words`` boosted, and per candidate its word index and bit,
        whether it is whitespace and its kind (kept for the last few guides)."""
        cached = self._orderings.get(words)
        if cached is not None:
            return cached
        order = self.vocab.with_words(words)
        space = np.isin(order, self.vocab.whitespace)
        kinds = self.vocab.kinds[order]
        boosted = np.isin(order, np.asarray(words, dtype=np.int64))
        kinds[boosted] = WORD_KINDS + np.arange(int(boosted.sum()))  # each word a kind
        singles = self.vocab.singles
        first = self.vocab.num_singles_first
        probe = list(dict.fromkeys([*singles[:first].tolist(), *words, *singles[first:].tolist()]))
        entry = (order, order >> 5, (order & 31).astype(np.uint32), space, kinds, probe)
        if len(self._orderings) >= settings.ORDERINGS_KEPT:
            self._orderings.pop(next(iter(self._orderings)))
        self._orderings[words] = entry
        return entry

    def _search(self, matcher: GrammarMatcher, path: list[int], parent: int) -> object:
        """Extend ``path`` (accepted into ``matcher``) to a witness: ``_FOUND``; else
        ``_FAILED`` or ``_PRUNED`` (while cycles are pruned: the state's mask is its parent's, or
        the path ends with a cycle; no progress), with both left as they were. ``parent`` is
        the fingerprint of the parent state's mask."""
        depth = len(path)
        if self.nodes >= self._budget or self._too_slow():
            return _FAILED
        self.nodes += 1
        matcher.fill_next_token_bitmask(self._rows, depth)
        words = self._rows[depth].numpy()
        for stop in self.vocab.stop_token_ids:
            if (int(words[stop >> 5]) >> (stop & 31)) & 1:
                path.append(stop)
                return _FOUND
        left = self._limit - depth - 1  # tokens after this one: the last must be a stop token
        if left <= 0:
            return _FAILED
        fingerprint = hash(words.tobytes())
        if self._prune_cycles and (fingerprint == parent or self._repeats(path, fingerprint)):
            return _PRUNED
        self._fingerprints.append(fingerprint)
        try:
            return self._expand(matcher, path, words, fingerprint)
        finally:
            self._fingerprints.pop()

    def _repeats(self, path: list[int], fingerprint: int) -> bool:
        """Whether the path ends with a cycle: its last ``k`` tokens repeat the ``k`` before
        them and lead back to the mask they started from (``ab`` ``ab`` under ``(ab)*c``)."""
        depth = len(path)
        for k in range(1, min(settings.MAX_CYCLE, depth // 2) + 1):
            if self._fingerprints[depth - k] == fingerprint and (
                path[depth - k :] == path[depth - 2 * k : depth - k]
            ):
                return True
        return False

    def _expand(
        self, matcher: GrammarMatcher, path: list[int], words: npt.NDArray[np.int32], fp: int
    ) -> object:
        """Try the state's preferred tokens (see :meth:`_search`)."""
        fingerprint = fp
        branches = 0
        for token in self._preferred(words):
            if not matcher.accept_token(token):
                continue
            path.append(token)
            result = self._search(matcher, path, fingerprint)
            if result is _FOUND:
                matcher.rollback(1)
                return _FOUND
            path.pop()
            matcher.rollback(1)
            branches += result is _FAILED
            if branches >= settings.BRANCHES or self.nodes >= self._budget:
                break
        return _FAILED

    def _preferred(self, words: npt.NDArray[np.int32]) -> list[int]:
        """The first ``PER_STATE`` allowed tokens in preference order: closers, the guide's own
        words, the rest; whitespace only where nothing else is allowed (else the lowest allowed
        token ids)."""
        unsigned = words.view(np.uint32)
        order, order_words, order_bits, is_space, kinds, _ = self._order
        hits = np.flatnonzero((unsigned[order_words] >> order_bits) & 1)
        solid = hits[~is_space[hits]]
        if solid.size:  # the first token of each kind: a number or a word counts once
            seen: set[int] = set()
            picked: list[int] = []
            head = solid[: settings.KIND_SCAN]
            for index, kind in zip(head.tolist(), kinds[head].tolist(), strict=True):
                if kind not in seen:
                    seen.add(kind)
                    picked.append(int(order[index]))
                    if len(picked) == settings.PER_STATE:
                        return picked
            if solid.size > settings.KIND_SCAN:  # a long run of one kind (numbers): all of them
                _, first = np.unique(kinds[solid], return_index=True)
                picked = order[solid[np.sort(first)[: settings.PER_STATE]]].tolist()
            return picked
        if hits.size:
            spaces: list[int] = order[hits[: settings.PER_STATE]].tolist()
            return spaces
        nonzero = np.flatnonzero(unsigned)[: settings.PER_STATE]
        ids = []
        for word in nonzero.tolist():
            bits = int(unsigned[word])
            ids += [word * 32 + b for b in range(32) if bits >> b & 1]
        return [t for t in ids if t < self.vocab.vocab_size][: settings.PER_STATE]


_FOUND, _FAILED, _PRUNED = object(), object(), object()
