"""Driving matchers in tests: feeding tokens, reading masks, checking whole outputs."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import torch

from guidedec.bitmask.layout import BITMASK_DTYPE, bitmask_size
from guidedec.grammar import GrammarMatcher, GrammarMatcherFactory, GuidedDecodingParams
from guidedec.grammar.matcher import WrappedMatcher
from guidedec.testing.masks import bitmask_to_bool_mask
from guidedec.tokenizer import TokenizerInfo


def feed_tokens(matcher: GrammarMatcher, tokens: Sequence[int]) -> int:
    """Accept ``tokens`` one by one; returns how many were accepted before the first rejection."""
    for i, token in enumerate(tokens):
        if not matcher.accept_token(token):
            return i
    return len(tokens)


def next_token_mask(matcher: GrammarMatcher, vocab_size: int) -> torch.Tensor:
    """The matcher's next-token bitmask as a fresh ``[ceil(V / 32)]`` int32 row."""
    bitmask = torch.zeros(1, bitmask_size(vocab_size), dtype=BITMASK_DTYPE)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0]


def allowed_token_ids(row: torch.Tensor, vocab_size: int) -> set[int]:
    """The token ids a bitmask row allows (padding bits ignored)."""
    allowed = bitmask_to_bool_mask(row.unsqueeze(0), vocab_size)[0]
    return set(torch.nonzero(allowed).flatten().tolist())


def accepts_output(
    factory: GrammarMatcherFactory,
    tokenizer: TokenizerInfo,
    params: GuidedDecodingParams,
    text: str,
) -> bool:
    """Whether ``text`` (tokenised as the model would) is a complete output of the guide: every
    token is accepted, then a stop token. Raises ``GrammarError`` if the guide does not compile."""
    matcher = factory.create(params)
    tokens = tokenizer.encode(text)
    if feed_tokens(matcher, tokens) != len(tokens):
        return False
    return matcher.accept_token(tokenizer.eos_token_id)


class SlowMasks(WrappedMatcher):
    """A real matcher whose mask fills sleep ``sleep_s`` first: every fill, or only the fills
    numbered in ``at`` (from 1). ``fills`` counts them. Stands for a guide whose masks are slow
    (llguidance's lexer on a nested Lark repetition takes tens of milliseconds a mask)."""

    def __init__(
        self, inner: GrammarMatcher, sleep_s: float, at: Collection[int] | None = None
    ) -> None:
        super().__init__(inner)
        self.sleep_s, self.at, self.fills = sleep_s, at, 0

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        self.fills += 1
        if self.at is None or self.fills in self.at:
            time.sleep(self.sleep_s)
        self.inner.fill_next_token_bitmask(bitmask, index)
