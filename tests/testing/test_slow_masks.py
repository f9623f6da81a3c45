"""The slow-masks matcher of guidedec.testing: the same masks, only later."""

from __future__ import annotations

import time

import torch

from guidedec import GuidedDecodingConfig, GuidedDecodingParams, TokenizerInfo
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.testing import SlowMasks, next_token_mask


def test_slow_masks_sleep_at_the_chosen_fills_and_fill_what_the_matcher_fills(
    tokenizer: TokenizerInfo,
) -> None:
    config = GuidedDecodingConfig(backend="xgrammar", tokenizer=tokenizer)
    factory = create_grammar_matcher_factory(config)
    guide = GuidedDecodingParams(regex="[ab]{4}")
    plain, slow = factory.create(guide), SlowMasks(factory.create(guide), 0.05, at={2})
    took = []
    for token in [*tokenizer.encode("a"), *tokenizer.encode("b")]:
        began = time.perf_counter()
        row = next_token_mask(slow, tokenizer.vocab_size)
        took.append(time.perf_counter() - began)
        assert torch.equal(row, next_token_mask(plain, tokenizer.vocab_size))
        assert slow.accept_token(token) and plain.accept_token(token)
    assert slow.fills == 2
    assert took[0] < 0.05 <= took[1]
