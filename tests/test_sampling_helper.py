"""The random-logits sampler that drives soundness tests and the demo."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec.testing import sample_from_logits


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
