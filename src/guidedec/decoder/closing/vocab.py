"""What closing knows of a tokenizer: the order in which the completion search tries tokens,
the tokens' kinds and texts, its one-character probe candidates, and its digit tokens.

Built once per tokenizer (decoding every token takes about a second) and kept on it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

import guidedec.decoder.closing.settings as settings
from guidedec.bitmask.layout import BITS_PER_WORD
from guidedec.tokenizer import TokenizerInfo

CLOSING_ORDER = "\"}])'>,;:"  # closers, then separators: both end what is open
CLOSERS = frozenset(CLOSING_ORDER)
SEPARATORS = frozenset(",;:")
# Closers, then at most one separator: `"}` or `",` ends things, `","` would open a new key.
_CLOSING_TOKEN = re.compile("[\"'}\\])>]*[,;:]?")
OPENERS = frozenset("{[(<")
JSON_STRUCTURE = frozenset('{}[],:"')


def preference_order(texts: Sequence[str], excluded: set[int]) -> npt.NDArray[np.int64]:
    """Token ids in the order the search tries them (see the module docstring), with the number
    of leading *structural* ones (closers, balanced structure, separators) that the guide's
    words follow. Short printable ASCII tokens (at most ``MAX_CANDIDATE_CHARS`` characters)
    only, so that the per-state check stays cheap; a guide's longer words come from
    ``guide_words``. Tokens with no text and ``excluded`` ones (stop and added special
    tokens) are left out."""
    keyed = []
    for token_id, text in enumerate(texts):
        printable = text.isascii() and (text.isprintable() or text.isspace())
        if (
            not text
            or token_id in excluded
            or not printable
            or len(text) > settings.MAX_CANDIDATE_CHARS
        ):
            continue
        keyed.append((*_preference(text), token_id))
    keyed.sort()
    return np.array([key[-1] for key in keyed], dtype=np.int64)


STRUCTURAL_RANKS = 3
"""Ranks of :func:`_preference` that count as structural (the guide's words come after)."""


def _preference(text: str) -> tuple[int, int, int, int, int]:
    """The sort key of a candidate token: its rank first (see the module docstring)."""
    if _CLOSING_TOKEN.fullmatch(text) and text[0] not in SEPARATORS:
        # By first character, `""` (an empty string) first, then longest, then by last
        # character: `}]` before `},`, which commits to another item.
        first, last = CLOSING_ORDER.find(text[0]), CLOSING_ORDER.find(text[-1])
        return (0, first, text != '""', -len(text), last)
    if all(ch in JSON_STRUCTURE for ch in text) and _balanced(text) and text[-1] != ",":
        return (1, -len(text), 0, 0, 0)  # `{"`, `,"`, `[]`: one token for two
    if _CLOSING_TOKEN.fullmatch(text):
        return (2, CLOSING_ORDER.find(text[0]), -len(text), 0, 0)  # separators
    if text.isdigit():  # shortest first, "0" first: a number in one token
        return (3, len(text) - 100, int(text), 0, 0)
    if any(ch.isspace() for ch in text):
        return (5, len(text), 0, 0, 0)
    if any(ch in OPENERS for ch in text):
        return (4, len(text), 0, 0, 0)
    return (3, -len(text), 0, 0, 0)  # longest first: a key or a literal in few tokens


def _balanced(text: str) -> bool:
    """Whether a structural token opens at most one bracket it does not close (``{"``, ``[]``,
    ``,"``, but not ``[{``); one that ends with ``,`` commits to another item and is left out."""
    depth = 0
    for ch in text:
        depth += (ch in "{[") - (ch in "}]")
    return depth <= 1 and text.count("{") + text.count("[") <= 1


@dataclass(frozen=True)
class DigitTokens:
    """The tokens made of ASCII digits only, read from the vocabulary's own strings (fast: no
    decoding), for the bound on digit runs."""

    lengths: npt.NDArray[np.int16]  # per token id: its length if it is all digits, else 0
    words: npt.NDArray[np.int32]  # a bitmask row of those tokens
    real_words: npt.NDArray[np.int32]  # a bitmask row of every token below the vocabulary size

    @classmethod
    def of(cls, tokenizer: TokenizerInfo) -> DigitTokens:
        return tokenizer.backend_object("digits", lambda: cls._build(tokenizer))

    @classmethod
    def _build(cls, tokenizer: TokenizerInfo) -> DigitTokens:
        size = tokenizer.vocab_size
        lengths = np.zeros(size, dtype=np.int16)
        for text, token_id in tokenizer.hf_tokenizer.get_vocab().items():
            if token_id < size and text.isascii() and text.isdigit():
                lengths[token_id] = len(text)
        return cls(lengths, _bitmask_row(lengths > 0), _bitmask_row(np.ones(size, dtype=bool)))


def _bitmask_row(allowed: npt.NDArray[np.bool_]) -> npt.NDArray[np.int32]:
    padded = -(-allowed.shape[0] // BITS_PER_WORD) * BITS_PER_WORD
    bits = np.zeros(padded, dtype=np.bool_)
    bits[: allowed.shape[0]] = allowed
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)


_DIGITS, _CLOSER_KINDS, WORD_KINDS = 1, 1 << 19, 1 << 20


def token_kind(text: str) -> int:
    """What the search tells apart among a state's allowed tokens: tokens that start with a
    digit are one kind (a number's digits are interchangeable); otherwise the first character
    is the kind."""
    first = text[0]
    return _DIGITS if first.isdigit() else 16 + ord(first)


PROBE_FIRST = CLOSING_ORDER + "{[0"
"""The characters the probe tries before a guide's words: closers and separators (they end
what is open), openers (a value that must be an object or an array) and a digit (a number)."""


def _probe_singles(
    texts: Sequence[str], excluded: set[int]
) -> tuple[npt.NDArray[np.int64], int, dict[int, int]]:
    """The one-character tokens of printable ASCII (no whitespace): those of ``PROBE_FIRST`` in
    its order, then the rest in code order; how many come first; and the closer of each
    opener (``{`` -> ``}``, ``[`` -> ``]``), by token id."""
    ids: dict[str, int] = {}
    for token_id, text in enumerate(texts):
        one = len(text) == 1 and text.isascii() and text.isprintable() and text != " "
        if one and token_id not in excluded:
            ids.setdefault(text, token_id)
    first = [ids[ch] for ch in PROBE_FIRST if ch in ids]
    rest = [ids[ch] for ch in sorted(ids) if ch not in PROBE_FIRST]
    pairs = {ids[o]: ids[c] for o, c in ("{}", "[]", "()") if o in ids and c in ids}
    return np.array(first + rest, dtype=np.int64), len(first), pairs


@dataclass(frozen=True)
class ClosingVocab:
    """What the search knows of a tokenizer: its preferred tokens, the whitespace ones among
    them, its closers and its stop tokens."""

    order: npt.NDArray[np.int64]
    whitespace: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.int64]  # per token id: its first character's kind (see token_kind)
    structural: npt.NDArray[np.bool_]  # per token id: it holds a JSON structural character
    num_closers: int
    stop_token_ids: tuple[int, ...]
    vocab_size: int
    singles: npt.NDArray[np.int64]  # one-character tokens in the probe's order
    num_singles_first: int  # those tried before the guide's words
    closer_of: dict[int, int]  # opener token -> its closer (the probe tries it right after)
    texts: tuple[str, ...]  # per token id below the tokenizer's length: its text alone

    def with_words(self, words: Sequence[int]) -> npt.NDArray[np.int64]:
        """The order with ``words`` moved right after the closers."""
        if not words:
            return self.order
        boosted = np.array(list(dict.fromkeys(words)), dtype=np.int64)
        rest = self.order[self.num_closers :]
        return np.concatenate(
            [self.order[: self.num_closers], boosted, rest[~np.isin(rest, boosted)]]
        )

    @classmethod
    def of(cls, tokenizer: TokenizerInfo) -> ClosingVocab:
        """Built once per tokenizer (decoding every token takes about a second)."""
        return tokenizer.backend_object("closing", lambda: cls._build(tokenizer))

    @classmethod
    def _build(cls, tokenizer: TokenizerInfo) -> ClosingVocab:
        hf = tokenizer.hf_tokenizer
        texts = tokenizer.token_texts()
        excluded = set(tokenizer.stop_token_ids) | set(hf.get_added_vocab().values())
        order = preference_order(texts, excluded)
        spaces = [t for t in order.tolist() if any(ch.isspace() for ch in texts[t])]
        closers = sum(1 for t in order.tolist() if _preference(texts[t])[0] < STRUCTURAL_RANKS)
        kinds = np.zeros(tokenizer.vocab_size, dtype=np.int64)
        for position, token_id in enumerate(order.tolist()):  # each closer a kind of its own
            kinds[token_id] = (
                _CLOSER_KINDS + position if position < closers else token_kind(texts[token_id])
            )
        structural = np.zeros(tokenizer.vocab_size, dtype=np.bool_)
        for token_id, text in enumerate(texts):
            structural[token_id] = any(ch in JSON_STRUCTURE for ch in text)
        singles, first, pairs = _probe_singles(texts, excluded)
        return cls(
            order,
            np.array(spaces, dtype=np.int64),
            kinds,
            structural,
            closers,
            tokenizer.stop_token_ids,
            tokenizer.vocab_size,
            singles,
            first,
            pairs,
            tuple(texts),
        )
