"""The bitmask layout (size, allocation, validity check) and the packing helpers of testing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec.bitmask import (
    BITMASK_DTYPE,
    HostRowChecker,
    allocate_bitmask,
    bitmask_size,
    row_has_valid_token,
    token_word,
)
from guidedec.testing import (
    bitmask_to_bool_mask,
    bool_mask_to_bitmask,
    mixed_density_bitmask,
    random_bitmask,
)

FAST = settings(max_examples=60, deadline=None)


@st.composite
def bool_masks(draw: st.DrawFn, max_rows: int = 4, max_vocab: int = 200) -> torch.Tensor:
    rows = draw(st.integers(0, max_rows))
    vocab = draw(st.integers(1, max_vocab))
    flat = draw(st.lists(st.booleans(), min_size=rows * vocab, max_size=rows * vocab))
    return torch.tensor(flat, dtype=torch.bool).reshape(rows, vocab)


def python_packed_row(allowed: list[bool]) -> list[int]:
    """Pack one row with plain integers: bit t % 32 of word t // 32, as signed int32."""
    words = []
    for start in range(0, len(allowed), 32):
        unsigned = sum(1 << bit for bit, ok in enumerate(allowed[start : start + 32]) if ok)
        words.append(unsigned - (1 << 32) if unsigned >= 1 << 31 else unsigned)
    return words


@pytest.mark.parametrize(
    ("vocab_size", "words"), [(1, 1), (31, 1), (32, 1), (33, 2), (1000, 32), (129280, 4040)]
)
def test_bitmask_size_is_ceil_of_vocab_over_32(vocab_size: int, words: int) -> None:
    assert bitmask_size(vocab_size) == words


@pytest.mark.parametrize("vocab_size", [0, -5])
def test_bitmask_size_rejects_non_positive_vocab(vocab_size: int) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        bitmask_size(vocab_size)


def test_allocate_bitmask_is_int32_rows_by_words_all_allowed() -> None:
    bitmask = allocate_bitmask(3, 33)
    assert bitmask.dtype == BITMASK_DTYPE
    assert bitmask.shape == (3, 2)
    assert bool((bitmask == -1).all())
    assert bool(bitmask_to_bool_mask(bitmask, 33).all())


def test_allocate_bitmask_accepts_zero_rows_and_rejects_negative() -> None:
    assert allocate_bitmask(0, 10).shape == (0, 1)
    with pytest.raises(ValueError, match="rows"):
        allocate_bitmask(-1, 10)


def test_allocate_bitmask_pin_memory_without_accelerator_stays_usable() -> None:
    bitmask = allocate_bitmask(2, 64, pin_memory=True)
    assert bitmask.shape == (2, 2)
    assert bitmask.is_pinned() == torch.cuda.is_available()


@FAST
@given(bool_masks())
def test_bool_mask_round_trips_through_bitmask(allowed: torch.Tensor) -> None:
    bitmask = bool_mask_to_bitmask(allowed)
    assert bitmask.dtype == BITMASK_DTYPE
    assert bitmask.shape == (allowed.shape[0], bitmask_size(allowed.shape[1]))
    assert torch.equal(bitmask_to_bool_mask(bitmask, allowed.shape[1]), allowed)


@FAST
@given(bool_masks(), st.booleans())
def test_packing_matches_plain_integer_bit_arithmetic(
    allowed: torch.Tensor, padding_allowed: bool
) -> None:
    vocab = allowed.shape[1]
    padded_vocab = bitmask_size(vocab) * 32
    expected = [
        python_packed_row(row + [padding_allowed] * (padded_vocab - vocab))
        for row in allowed.tolist()
    ]
    packed = bool_mask_to_bitmask(allowed, padding_allowed=padding_allowed)
    assert packed.tolist() == expected


@FAST
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=8), st.data())
def test_bitmask_round_trips_through_bool_mask_up_to_padding(
    words: list[int], data: st.DataObject
) -> None:
    vocab = data.draw(st.integers(32 * len(words) - 31, 32 * len(words)))
    bitmask = torch.tensor([words], dtype=BITMASK_DTYPE)
    repacked = bool_mask_to_bitmask(bitmask_to_bool_mask(bitmask, vocab))
    padding = vocab % 32
    expected = bitmask.clone()
    if padding:
        expected[0, -1] &= (1 << padding) - 1
    assert torch.equal(repacked, expected)


def test_one_dimensional_mask_packs_to_one_dimensional_row() -> None:
    allowed = torch.tensor([True, False, True])
    assert bool_mask_to_bitmask(allowed).tolist() == [0b101]
    assert bitmask_to_bool_mask(torch.tensor([0b101], dtype=BITMASK_DTYPE), 3).tolist() == [
        True,
        False,
        True,
    ]


def test_token_31_is_the_sign_bit_of_word_0() -> None:
    allowed = torch.zeros(1, 33, dtype=torch.bool)
    allowed[0, 31] = True
    allowed[0, 32] = True
    assert bool_mask_to_bitmask(allowed).tolist() == [[-(2**31), 1]]


def test_packing_helpers_reject_wrong_dtypes_and_short_bitmasks() -> None:
    with pytest.raises(ValueError, match="bool"):
        bool_mask_to_bitmask(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        bitmask_to_bool_mask(torch.zeros(2, 1, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="exceeds"):
        bitmask_to_bool_mask(torch.zeros(2, 1, dtype=torch.int32), 33)


@FAST
@given(bool_masks(max_rows=1), st.booleans())
def test_row_has_valid_token_iff_some_token_below_vocab_is_allowed(
    allowed: torch.Tensor, padding_allowed: bool
) -> None:
    if allowed.shape[0] == 0:
        return
    row = bool_mask_to_bitmask(allowed, padding_allowed=padding_allowed)[0]
    assert row_has_valid_token(row, allowed.shape[1]) == bool(allowed.any())


@FAST
@given(bool_masks(max_rows=4), st.booleans())
def test_host_row_checker_agrees_with_row_has_valid_token(
    allowed: torch.Tensor, padding_allowed: bool
) -> None:
    bitmask = bool_mask_to_bitmask(allowed, padding_allowed=padding_allowed)
    check = HostRowChecker(bitmask, allowed.shape[1])
    for i in range(allowed.shape[0]):
        assert (
            check(i) == row_has_valid_token(bitmask[i], allowed.shape[1]) == bool(allowed[i].any())
        )
    # The checker reads the buffer live: a later write is seen.
    if allowed.shape[0]:
        bitmask[0].zero_()
        assert check(0) is False


@FAST
@given(bool_masks(max_rows=3), st.booleans(), st.data())
def test_host_row_checker_allows_exactly_the_set_bits_below_the_vocabulary(
    allowed: torch.Tensor, padding_allowed: bool, data: st.DataObject
) -> None:
    rows, vocab = allowed.shape
    bitmask = bool_mask_to_bitmask(allowed, padding_allowed=padding_allowed)
    check = HostRowChecker(bitmask, vocab)
    for row in range(rows):
        for token in range(vocab):
            assert check.allows(row, token) == bool(allowed[row, token])
        # Outside the vocabulary nothing is allowed, the padding bits of the last word included.
        last_padding_bit = max(vocab, (vocab + 31) // 32 * 32 - 1)
        outside = data.draw(st.sampled_from([-1, vocab, last_padding_bit, 10**6]))
        assert check.allows(row, outside) is False
    if rows:  # live reads, as the validity check
        bitmask[0].zero_()
        assert not any(check.allows(0, token) for token in range(vocab))


def test_host_row_checker_needs_an_int32_host_bitmask() -> None:
    with pytest.raises(ValueError, match="int32"):
        HostRowChecker(torch.zeros(2, 3, dtype=torch.int64), 70)


@pytest.mark.parametrize("vocab_size", [1, 31, 33, 63])
def test_row_with_only_padding_bits_set_has_no_valid_token(vocab_size: int) -> None:
    row = bool_mask_to_bitmask(torch.zeros(vocab_size, dtype=torch.bool), padding_allowed=True)
    assert row_has_valid_token(row, vocab_size) is False


def test_row_has_valid_token_sees_the_last_real_token() -> None:
    allowed = torch.zeros(33, dtype=torch.bool)
    allowed[32] = True
    assert row_has_valid_token(bool_mask_to_bitmask(allowed), 33) is True


@pytest.mark.parametrize("density", [0.0, 1.0])
def test_random_bitmask_extreme_densities_give_uniform_rows(density: float) -> None:
    generator = torch.Generator().manual_seed(0)
    bitmask = random_bitmask(3, 70, density=density, generator=generator)
    assert bool((bitmask_to_bool_mask(bitmask, 70) == (density == 1.0)).all())


def test_random_bitmask_density_sets_the_allowed_fraction() -> None:
    generator = torch.Generator().manual_seed(0)
    bitmask = random_bitmask(4, 10_000, density=0.01, generator=generator)
    fraction = bitmask_to_bool_mask(bitmask, 10_000).float().mean().item()
    assert 0.005 < fraction < 0.015


def test_random_bitmask_rejects_density_outside_unit_interval() -> None:
    with pytest.raises(ValueError, match="density"):
        random_bitmask(1, 10, density=1.5)


def test_mixed_density_bitmask_cycles_row_densities() -> None:
    generator = torch.Generator().manual_seed(0)
    bitmask = mixed_density_bitmask(4, 64, densities=(0.0, 1.0), generator=generator)
    allowed = bitmask_to_bool_mask(bitmask, 64)
    assert allowed.all(dim=1).tolist() == [False, True, False, True]
    assert (~allowed).all(dim=1).tolist() == [True, False, True, False]


@pytest.mark.parametrize("token", [None, 0, 511, 512, 1023, 1999])
def test_host_row_checker_finds_a_token_past_its_probe(token: int | None) -> None:
    """The checker looks at the first words before the whole row: a row allowing one token
    anywhere, inside or past those words, is valid; an empty one is not."""
    allowed = torch.zeros(2, 2000, dtype=torch.bool)
    if token is not None:
        allowed[1, token] = True
    bitmask = bool_mask_to_bitmask(allowed)
    check = HostRowChecker(bitmask, 2000)
    assert check(0) is False
    assert check(1) is (token is not None)
    # Probe and scan read the buffer live: a token written after the checker was made counts.
    if token is not None:
        bitmask[0, token // 32] = token_word(token)
        assert check(0) is True
