"""MaskBuffer returns, call after call, exactly what apply_bitmask leaves in the logits.

The buffer keeps state between calls (-inf where nothing was written), so the property test runs
sequences of calls with changing row counts, densities and token masks, and between calls does
to the returned tensor what a sampler does to it (divides by a temperature, masks a top-k).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec.bitmask import BITMASK_DTYPE, MaskBuffer, apply_bitmask
from guidedec.testing import mixed_density_bitmask, random_bitmask

DENSITIES = (0.0, 0.003, 0.01, 0.5, 0.9, 0.99, 1.0)
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


def reference(
    logits: torch.Tensor, bitmask: torch.Tensor, token_mask: torch.Tensor | None
) -> torch.Tensor:
    out = logits.clone()
    apply_bitmask(out, bitmask, token_mask=token_mask, backend="torch")
    return out


def assert_bit_identical(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    view = INT_VIEW[actual.dtype]
    assert torch.equal(actual.view(view), expected.view(view))


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(list(INT_VIEW)),
    vocab=st.sampled_from([33, 1000, 4099]),
    uncovered=st.integers(0, 40),
    steps=st.lists(
        st.tuples(
            st.lists(st.sampled_from(DENSITIES), min_size=1, max_size=7),
            st.lists(st.booleans(), min_size=7, max_size=7),
            st.sampled_from(["none", "temperature", "top-k"]),
        ),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 2**16),
)
def test_each_call_returns_what_apply_bitmask_leaves(
    dtype: torch.dtype,
    vocab: int,
    uncovered: int,
    steps: list[tuple[list[float], list[bool], str]],
    seed: int,
) -> None:
    generator = torch.Generator().manual_seed(seed)
    buffer = MaskBuffer()
    for densities, selected, after in steps:
        rows = len(densities)
        bitmask = mixed_density_bitmask(rows, vocab, densities=densities, generator=generator)
        # logits may be wider than the bitmask covers: those columns are always masked
        logits = torch.randn(rows, bitmask.shape[1] * 32 + uncovered, generator=generator)
        logits = logits[:, : vocab + uncovered].to(dtype)
        token_mask = torch.tensor(selected[:rows], dtype=torch.bool) if rows % 2 else None
        before = logits.clone()
        expected = reference(logits, bitmask, token_mask)
        masked = buffer.apply(logits, bitmask, token_mask)
        assert_bit_identical(masked, expected)
        if masked.data_ptr() != logits.data_ptr():
            assert_bit_identical(logits, before)  # the buffer was returned: logits untouched
        if after == "temperature":
            masked.div_(0.7)
        elif after == "top-k":
            kth = masked.float().topk(1, dim=-1).values
            masked.masked_fill_(masked.float() < kth, float("-inf"))
    assert buffer.buffered_calls + buffer.inplace_calls <= len(steps)


def test_sparse_rows_go_to_the_buffer_and_dense_batches_stay_in_place() -> None:
    generator = torch.Generator().manual_seed(0)
    vocab = 129280
    buffer = MaskBuffer()
    sparse = random_bitmask(8, vocab, density=0.001, generator=generator)
    logits = torch.randn(8, vocab, generator=generator)
    first = buffer.apply(logits, sparse)
    assert first.data_ptr() != logits.data_ptr() and buffer.buffered_calls == 1
    assert_bit_identical(first, reference(logits, sparse, None))
    # the next call writes the new allowed entries and puts -inf back at the old ones
    other = random_bitmask(8, vocab, density=0.001, generator=generator)
    second = buffer.apply(logits, other)
    assert second.data_ptr() == first.data_ptr()
    assert_bit_identical(second, reference(logits, other, None))
    # inside strings (nearly every token allowed) a copy would cost more than the fills saved
    dense = random_bitmask(8, vocab, density=0.99, generator=generator)
    third = buffer.apply(logits, dense)
    assert third.data_ptr() == logits.data_ptr() and buffer.inplace_calls == 1


def test_a_row_written_whole_is_filled_again_when_it_becomes_sparse() -> None:
    generator = torch.Generator().manual_seed(1)
    vocab = 4096
    buffer = MaskBuffer()
    densities = [0.001] * 7 + [0.5]  # seven sparse rows and one blended: the buffer wins
    first = mixed_density_bitmask(8, vocab, densities=densities, generator=generator)
    logits = torch.randn(8, vocab, generator=generator)
    assert buffer.apply(logits, first).data_ptr() != logits.data_ptr()
    second = random_bitmask(8, vocab, density=0.001, generator=generator)
    masked = buffer.apply(logits, second)
    assert masked.data_ptr() != logits.data_ptr()
    assert_bit_identical(masked, reference(logits, second, None))
    assert int(np.isfinite(masked[7].numpy()).sum()) == int(
        np.isfinite(reference(logits, second, None)[7].numpy()).sum()
    )


def test_bad_inputs_are_refused_as_apply_bitmask_refuses_them() -> None:
    buffer = MaskBuffer()
    with pytest.raises(ValueError, match="bitmask has 2 rows but logits have 1"):
        buffer.apply(torch.zeros(1, 64), torch.zeros(2, 2, dtype=BITMASK_DTYPE))
    with pytest.raises(ValueError, match="2-D logits"):
        buffer.apply(torch.zeros(64), torch.zeros(2, dtype=BITMASK_DTYPE))
