"""Sparse rows: their allowed token ids, handed over by the decoder and sampled from alone.

The oracle for ``sparse_allowed_tokens`` is the boolean mask the bitmask was packed from; the
oracle for the sparse draw is ``sample`` on the masked row, token for token in float64.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import GuidedDecodingParams, GuidedRequest
from guidedec.bitmask import apply_bitmask, sparse_allowed_tokens
from guidedec.engine.sampling import SamplingParams, sample
from guidedec.testing import bool_mask_to_bitmask, make_decoder
from guidedec.tokenizer import TokenizerInfo

FAST = settings(max_examples=60, deadline=None)


@st.composite
def sparse_masks(draw: st.DrawFn) -> torch.Tensor:
    """Up to 5 rows over up to 300 tokens, each allowing a random handful (or none, or all)."""
    rows, vocab = draw(st.integers(1, 5)), draw(st.integers(1, 300))
    mask = torch.zeros(rows, vocab, dtype=torch.bool)
    for row in range(rows):
        kind = draw(st.sampled_from(["few", "none", "all"]))
        if kind == "all":
            mask[row] = True
        elif kind == "few":
            ids = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12))
            mask[row, ids] = True
    return mask


@FAST
@given(sparse_masks(), st.integers(1, 20), st.booleans())
def test_sparse_allowed_tokens_match_the_mask(
    mask: torch.Tensor, max_allowed: int, padding_allowed: bool
) -> None:
    bitmask = bool_mask_to_bitmask(mask, padding_allowed=padding_allowed)
    rows = list(range(mask.shape[0]))[::-1]  # any order of rows
    taken = sparse_allowed_tokens(bitmask, rows, mask.shape[1], max_allowed)
    for row in rows:
        allowed = mask[row].nonzero().flatten()
        if 0 < allowed.numel() <= max_allowed:
            assert torch.equal(taken[row], allowed)  # ascending, padding bits ignored
        else:
            assert row not in taken


def test_sparse_allowed_tokens_needs_a_host_int32_bitmask() -> None:
    with pytest.raises(ValueError, match="int32"):
        sparse_allowed_tokens(torch.zeros(2, 3, dtype=torch.int64), [0], 70, 4)
    assert sparse_allowed_tokens(torch.zeros(2, 3, dtype=torch.int32), [], 70, 4) == {}


@pytest.mark.parametrize("top", [{}, {"top_k": 3}, {"top_p": 0.7}, {"temperature": 0.0}])
def test_sparse_draw_equals_the_masked_draw_token_for_token(top: dict[str, float]) -> None:
    """float64: sampling a row from its allowed logits gives the token that sampling the masked
    row gives, seed by seed (the distributions are equal; only rounding could differ)."""
    gen = torch.Generator().manual_seed(0)
    vocab, rows = 4000, 6
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 3
    mask = torch.rand(rows, vocab, generator=gen) < 0.004
    mask[:, 17] = True  # every row allows a token
    bitmask = bool_mask_to_bitmask(mask)
    masked = logits.clone()
    apply_bitmask(masked, bitmask)
    allowed = sparse_allowed_tokens(bitmask, list(range(rows)), vocab, vocab // 32)
    assert set(allowed) == set(range(rows))
    params = [SamplingParams(**{"temperature": 1.0, **top})] * rows
    for seed in range(200):

        def generators(seed: int = seed) -> list[torch.Generator | None]:
            return [torch.Generator().manual_seed(seed * rows + i) for i in range(rows)]

        expected = sample(masked, params, generators())
        assert sample(logits, params, generators(), allowed=allowed) == expected
        assert all(mask[row, token] for row, token in enumerate(expected))


def test_sparse_draw_checks_the_allowed_logits() -> None:
    logits = torch.zeros(2, 8)
    logits[0, 3] = float("nan")
    allowed = {0: torch.tensor([3, 5]), 1: torch.tensor([], dtype=torch.int64)}
    params, gens = [SamplingParams(temperature=1.0)], [torch.Generator()]
    with pytest.raises(ValueError, match="row 0 contains NaN"):
        sample(logits, params, gens, rows=[0], allowed=allowed)
    with pytest.raises(ValueError, match="row 1 has no allowed token"):
        sample(logits, params, gens, rows=[1], allowed=allowed)
    logits[0, 3] = float("-inf")  # a forbidden NaN elsewhere is never read
    logits[0, 0] = float("nan")
    assert sample(logits, params, gens, rows=[0], allowed=allowed) == [5]


def test_decoder_hands_over_sparse_rows_and_leaves_them_unmasked(
    tokenizer: TokenizerInfo,
) -> None:
    """A digit regex allows few tokens (sparse), free text allows nearly all (dense), an
    unguided row is not filled: only the sparse row is taken, its ids are what the mask
    allowed, and apply then masks every other filled row but not it."""
    vocab = tokenizer.vocab_size
    decoder = make_decoder(tokenizer, "xgrammar", max_num_sequences=3)
    guides = [GuidedDecodingParams(regex="[0-9]{3}"), GuidedDecodingParams(regex=".{0,40}"), None]
    decoder.add_batch(
        [GuidedRequest.context(g, request_id=i, seq_slot=i) for i, g in enumerate(guides)]
    )
    assert decoder.build() == []
    mask = decoder.bitmask_host[:2].clone()
    taken = decoder.take_sparse_rows([0, 1, 2], vocab // 32)
    assert list(taken) == [0]
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[taken[0]] = True
    assert torch.equal(bool_mask_to_bitmask(allowed[None])[0], mask[0])
    logits = torch.randn(3, vocab)
    original = logits.clone()
    decoder.copy_and_apply(logits)
    assert torch.equal(logits[0], original[0])  # handed over: not masked here
    assert torch.equal(logits[2], original[2])  # unguided
    assert bool((logits[1] == float("-inf")).any()) and not torch.equal(logits[1], original[1])
