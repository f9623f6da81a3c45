"""The random-logits sampler that drives soundness tests and the demo."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import GuidedDecodingParams, TokenizerInfo
from guidedec.testing import (
    GeneratedOutput,
    accepts_output,
    allowed_token_ids,
    host_row_token_ids,
    make_decoder,
    random_bitmask,
    random_guided_generate,
    sample_allowed_token,
    sample_from_logits,
    uniform_guided_generate,
)


@settings(max_examples=50, deadline=None)
@given(
    allowed=st.lists(st.booleans(), min_size=1, max_size=70).filter(any),
    seed=st.integers(0, 2**16),
)
def test_sampler_never_draws_a_masked_token(allowed: list[bool], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, len(allowed), generator=generator)
    logits[0, ~torch.tensor(allowed)] = float("-inf")
    for _ in range(50):
        token = int(sample_from_logits(logits, 1.0, generator)[0])
        assert allowed[token]


def test_sampler_follows_the_softmax_distribution() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.arange(6, dtype=torch.float32).repeat(4000, 1)
    tokens = sample_from_logits(logits, 2.0, generator)
    frequencies = torch.bincount(tokens, minlength=6).float() / 4000
    expected = torch.softmax(logits[0] / 2.0, dim=0)
    assert torch.allclose(frequencies, expected, atol=0.03)


@settings(max_examples=50, deadline=None)
@given(vocab_size=st.integers(1, 200), density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_host_row_token_ids_match_the_torch_unpacking(
    vocab_size: int, density: float, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    bitmask = random_bitmask(1, vocab_size, density=density, generator=generator)
    bitmask[0, -1] = -1  # padding bits past the vocabulary must not count
    expected = allowed_token_ids(bitmask[0], vocab_size)
    assert set(host_row_token_ids(bitmask[0].numpy(), vocab_size).tolist()) == expected


def _first_tokens(generate: Callable[..., list[GeneratedOutput]], guide: str) -> Counter[str]:
    tokenizer = TokenizerInfo.default()
    decoder = make_decoder(tokenizer, max_num_sequences=64)
    params = GuidedDecodingParams(regex=guide)
    factory = decoder.factory
    counts: Counter[str] = Counter()
    for seed in range(10):
        for output in generate(decoder, [params] * 64, seed=seed, max_tokens=8):
            assert output.finished and output.error is None
            text = tokenizer.decode(output.token_ids)
            assert accepts_output(factory, tokenizer, params, text)
            counts[text] += 1
    return counts


def test_uniform_generation_has_the_distribution_of_random_logits() -> None:
    # Three one-token outputs: under i.i.d. logits each is drawn a third of the time.
    random_counts = _first_tokens(random_guided_generate, "[xyz]")
    uniform_counts = _first_tokens(uniform_guided_generate, "[xyz]")
    assert set(random_counts) == set(uniform_counts) == {"x", "y", "z"}
    for text in "xyz":
        assert abs(random_counts[text] / 640 - 1 / 3) < 0.06
        assert abs(uniform_counts[text] / 640 - 1 / 3) < 0.06


@settings(max_examples=50, deadline=None)
@given(vocab_size=st.integers(1, 200), density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_sample_allowed_token_draws_only_allowed_tokens_and_all_of_them(
    vocab_size: int, density: float, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    bitmask = random_bitmask(1, vocab_size, density=density, generator=generator)
    bitmask[0, -1] |= -(1 << (vocab_size % 32)) if vocab_size % 32 else 0  # set padding bits
    allowed = allowed_token_ids(bitmask[0], vocab_size)
    rng = np.random.default_rng(seed)
    if not allowed:
        with pytest.raises(ValueError, match="allows no token"):
            sample_allowed_token(bitmask[0].numpy(), vocab_size, rng)
        return
    drawn = Counter(sample_allowed_token(bitmask[0].numpy(), vocab_size, rng) for _ in range(400))
    assert set(drawn) <= allowed
    if len(allowed) <= 8:  # each of a few tokens is drawn, about equally often
        assert set(drawn) == allowed
        assert max(drawn.values()) - min(drawn.values()) < 400 / len(allowed)
