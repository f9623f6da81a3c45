"""Every apply kernel is bit-exact against the reference, and the reference against an oracle.

The oracle unpacks the bitmask with numpy (``np.unpackbits``) and is independent of the torch
code; a hypothesis test also checks the reference against a plain-integer bit loop. Results are
compared as integer bit patterns, so -inf, NaN payloads and signed zeros must match exactly.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec.bitmask import BITMASK_DTYPE, apply_bitmask
from guidedec.bitmask.kernels import KERNELS, KernelSpec, _cpu, load_kernel, resolve_backend
from guidedec.testing import bool_mask_to_bitmask, mixed_density_bitmask, random_bitmask

# Every registered kernel whose dependency is installed, the reference included; kernels for
# other devices run here through their interpreter (Triton's, turned on below).
BACKENDS = sorted(
    name
    for name, spec in KERNELS.items()
    if spec.requires is None or importlib.util.find_spec(spec.requires) is not None
)
FAST_BACKENDS = [name for name in BACKENDS if name != "torch"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
VOCABS = [1, 31, 33, 1000, 129280]
DENSITIES = [0.0, 0.01, 0.03, 0.5, 0.97, 0.99, 1.0]
INT_VIEW = {
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float64: torch.int64,
}
FAST = settings(max_examples=80, deadline=None)


def bits_of(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a float tensor, so that equality is bit-for-bit."""
    return tensor.view(INT_VIEW[tensor.dtype])


def assert_bit_identical(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert torch.equal(bits_of(actual), bits_of(expected))


def oracle_allowed(
    bitmask: torch.Tensor, num_columns: int, d2t: torch.Tensor | None = None
) -> np.ndarray:
    """``[B, num_columns]`` bool from ``np.unpackbits`` of little-endian words."""
    words = bitmask.numpy().astype("<u4")
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little").astype(bool)
    targets = np.arange(num_columns) + (0 if d2t is None else d2t.numpy().astype(np.int64))
    covered = (targets >= 0) & (targets < bits.shape[1])
    allowed: np.ndarray = bits[:, np.where(covered, targets, 0)] & covered
    return allowed


def oracle_apply(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    token_mask: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
) -> torch.Tensor:
    """A masked copy of 2-D ``logits``; rows with ``token_mask == 0`` are copied unchanged."""
    forbidden = ~oracle_allowed(bitmask, logits.shape[1], d2t)
    if token_mask is not None:
        forbidden &= token_mask.numpy().astype(bool)[:, None]
    out = logits.clone()
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype)
    return torch.where(torch.from_numpy(forbidden), neg_inf, out)


def random_logits(
    rows: int, columns: int, dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    return torch.randn(rows, columns, generator=generator).to(dtype)


def applied(
    logits: torch.Tensor, bitmask: torch.Tensor, backend: str, **kwargs: object
) -> torch.Tensor:
    out = logits.clone()
    apply_bitmask(out, bitmask, backend=backend, **kwargs)  # type: ignore[arg-type]
    return out


@pytest.fixture(autouse=True)
def _interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels written for an accelerator run on CPU tensors through their interpreter."""
    for spec in KERNELS.values():
        if spec.interpreter_env is not None:
            monkeypatch.setenv(spec.interpreter_env, "1")


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_oracle_bit_for_bit(
    backend: str, density: float, vocab: int, dtype: torch.dtype, generator: torch.Generator
) -> None:
    bitmask = random_bitmask(3, vocab, density=density, generator=generator)
    logits = random_logits(3, vocab, dtype, generator)
    assert_bit_identical(applied(logits, bitmask, backend), oracle_apply(logits, bitmask))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [5, 8, 40, 100])
@pytest.mark.parametrize("density", [0.005, 0.02, 0.5, 0.98, 0.995])
def test_kernel_matches_oracle_on_runs_of_whole_bytes_and_words(
    backend: str, block_size: int, density: float, generator: torch.Generator
) -> None:
    vocab = 20_011
    bitmask = random_bitmask(4, vocab, density=density, generator=generator, block_size=block_size)
    logits = random_logits(4, vocab, torch.float32, generator)
    assert_bit_identical(applied(logits, bitmask, backend), oracle_apply(logits, bitmask))


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("batch", [1, 2, 8, 64])
def test_fast_kernel_matches_reference_on_mixed_density_batches(
    backend: str, batch: int, generator: torch.Generator
) -> None:
    vocab = 129280
    bitmask = mixed_density_bitmask(batch, vocab, generator=generator)
    logits = random_logits(batch, vocab, torch.float32, generator)
    assert_bit_identical(applied(logits, bitmask, backend), applied(logits, bitmask, "torch"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_dtype", [torch.int32, torch.bool])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_with_zero_token_mask_are_untouched_including_nan_payloads(
    backend: str, mask_dtype: torch.dtype, dtype: torch.dtype, generator: torch.Generator
) -> None:
    bitmask = mixed_density_bitmask(5, 1000, generator=generator)
    logits = random_logits(5, 1000, dtype, generator)
    payload_nan = torch.tensor(
        0x7FC0_1234 if dtype == torch.float32 else 0x7E12, dtype=INT_VIEW[dtype]
    )
    bits_of(logits)[:, ::7] = payload_nan  # NaNs with a non-default payload everywhere
    token_mask = torch.tensor([1, 0, 1, 0, 0], dtype=mask_dtype)
    out = applied(logits, bitmask, backend, token_mask=token_mask)
    assert_bit_identical(out, oracle_apply(logits, bitmask, token_mask))
    assert_bit_identical(out[1::2], logits[1::2])
    assert_bit_identical(out[4], logits[4])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("density", [0.001, 0.5, 0.999])
@pytest.mark.parametrize("dtype", DTYPES)
def test_allowed_nan_payloads_and_signed_zeros_survive_bit_for_bit(
    backend: str, density: float, dtype: torch.dtype, generator: torch.Generator
) -> None:
    vocab = 4000
    bitmask = random_bitmask(2, vocab, density=density, generator=generator)
    logits = random_logits(2, vocab, dtype, generator)
    raw = bits_of(logits)
    raw[:, 0::3] = 0x7FA0_0001 if dtype == torch.float32 else 0x7D01  # signalling-looking NaN
    raw[:, 1::3] = -(2**31) if dtype == torch.float32 else -(2**15)  # -0.0
    assert_bit_identical(applied(logits, bitmask, backend), oracle_apply(logits, bitmask))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 0.99, 1.0])
def test_d2t_masks_column_i_by_bit_of_target_i_plus_offset(
    backend: str, density: float, generator: torch.Generator
) -> None:
    draft_vocab, target_vocab = 300, 1000
    targets = torch.randperm(target_vocab, generator=generator)[:draft_vocab].sort().values
    d2t = targets - torch.arange(draft_vocab)
    bitmask = random_bitmask(4, target_vocab, density=density, generator=generator)
    logits = random_logits(4, draft_vocab, torch.float32, generator)
    out = applied(logits, bitmask, backend, d2t=d2t)
    assert_bit_identical(out, oracle_apply(logits, bitmask, d2t=d2t))
    column = 17
    allowed_bit = (int(bitmask[0, targets[column] // 32]) >> int(targets[column] % 32)) & 1
    assert (out[0, column] == float("-inf")).item() == (allowed_bit == 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d2t_dtype", [torch.int32, torch.int64])
def test_d2t_targets_outside_the_bitmask_are_masked(
    backend: str, d2t_dtype: torch.dtype, generator: torch.Generator
) -> None:
    bitmask = torch.full((2, 2), -1, dtype=BITMASK_DTYPE)  # 64 tokens, all allowed
    d2t = torch.tensor([0, 63, -3, 64, 1], dtype=d2t_dtype)  # targets 0, 64, -1, 67, 5
    logits = random_logits(2, 5, torch.float32, generator)
    out = applied(
        logits, bitmask, backend, d2t=d2t, token_mask=torch.tensor([1, 0], dtype=torch.int32)
    )
    assert torch.isinf(out[0]).tolist() == [False, True, True, True, False]
    assert_bit_identical(out[1], logits[1])


def strided_view(base: torch.Tensor, layout: str, vocab: int) -> torch.Tensor:
    """A view of ``base`` (so writes land in ``base``) with the given memory layout."""
    views = {
        "column_slice": lambda: base[:6, 3 : 3 + vocab],
        "every_other_row": lambda: base[::2, :vocab],
        "column_major": lambda: base.t()[:6, :vocab],  # column stride != 1, row stride 1
        "row_and_column_step": lambda: base[::2, : 2 * vocab : 2],
    }
    return views[layout]()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "layout", ["column_slice", "every_other_row", "column_major", "row_and_column_step"]
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_logits_are_masked_in_place_and_the_rest_untouched(
    backend: str, layout: str, dtype: torch.dtype, generator: torch.Generator
) -> None:
    vocab = 1000
    shape = (2 * vocab + 8, 12) if layout == "column_major" else (12, 2 * vocab + 8)
    base = random_logits(*shape, dtype, generator)
    expected_base = base.clone()
    view = strided_view(base, layout, vocab)
    assert view.data_ptr() >= base.data_ptr() and not view.is_contiguous()
    bitmask = mixed_density_bitmask(view.shape[0], vocab, generator=generator)
    strided_view(expected_base, layout, vocab).copy_(oracle_apply(view, bitmask))
    apply_bitmask(view, bitmask, backend=backend)  # type: ignore[arg-type]
    assert_bit_identical(base, expected_base)
    assert bool(torch.isneginf(base).any())


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_bitmask_is_read_correctly(backend: str, generator: torch.Generator) -> None:
    wide = mixed_density_bitmask(10, 1100, generator=generator)
    bitmask = wide[::2, :32]  # 1024 tokens, row stride 35 words
    logits = random_logits(5, 1000, torch.float32, generator)
    assert_bit_identical(applied(logits, bitmask, backend), oracle_apply(logits, bitmask))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 1.0])
def test_logit_columns_beyond_the_bitmask_are_masked(
    backend: str, density: float, generator: torch.Generator
) -> None:
    bitmask = random_bitmask(3, 64, density=density, generator=generator)  # covers 64 columns
    logits = random_logits(3, 100, torch.bfloat16, generator)
    out = applied(logits, bitmask, backend)
    assert bool(torch.isneginf(out[:, 64:]).all())
    assert_bit_identical(out, oracle_apply(logits, bitmask))
    token_mask = torch.tensor([0, 1, 0], dtype=torch.int32)
    out = applied(logits, bitmask, backend, token_mask=token_mask)
    assert_bit_identical(out, oracle_apply(logits, bitmask, token_mask))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", [1, 31, 33, 1000])
def test_bitmask_bits_beyond_the_logits_are_ignored(
    backend: str, vocab: int, generator: torch.Generator
) -> None:
    bitmask = mixed_density_bitmask(5, vocab + 70, generator=generator)
    cleared, set_ = bitmask.clone(), bitmask.clone()
    allowed_tail = torch.arange(bitmask.shape[1] * 32) >= vocab
    tail_words = bool_mask_to_bitmask(allowed_tail)
    cleared &= ~tail_words
    set_ |= tail_words
    logits = random_logits(5, vocab, torch.float32, generator)
    reference = oracle_apply(logits, bitmask)
    for variant in (bitmask, cleared, set_):
        assert_bit_identical(applied(logits, variant, backend), reference)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_dimensional_logits_are_one_row(backend: str, generator: torch.Generator) -> None:
    bitmask = random_bitmask(1, 100, density=0.5, generator=generator)
    logits = random_logits(1, 100, torch.float16, generator)
    expected = oracle_apply(logits, bitmask)[0]
    for words in (bitmask, bitmask[0]):
        assert_bit_identical(applied(logits[0], words, backend), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_is_a_no_op(backend: str) -> None:
    apply_bitmask(torch.zeros(0, 10), torch.zeros(0, 1, dtype=BITMASK_DTYPE), backend=backend)  # type: ignore[arg-type]


def test_cpu_kernel_plans_work_on_the_minority_side_of_bimodal_rows(
    generator: torch.Generator,
) -> None:
    vocab = 129280
    densities = [0.0, 0.005, 0.5, 0.99, 1.0, 0.99]
    rows = [random_bitmask(1, vocab, density=d, generator=generator) for d in densities]
    words = torch.cat(rows).numpy()
    active = np.array([True, True, True, True, True, False])
    plan = _cpu.plan_rows(words, vocab, active)
    assert plan.restore.tolist() == [True, True, False, False, False, False]
    assert plan.patch.tolist() == [False, False, False, True, False, False]
    assert plan.blend.tolist() == [False, False, True, False, False, False]
    # 90% allowed: blended where a patch is numpy's (up to 1/32 forbidden), patched where it
    # is xgrammar's kernel (up to 1/8)
    words = random_bitmask(1, vocab, density=0.9, generator=generator).numpy()
    one = np.array([True])
    assert _cpu.plan_rows(words, vocab, one).blend.tolist() == [True]
    assert _cpu.plan_rows(words, vocab, one, patch_divisor=8).patch.tolist() == [True]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strided", [False, True])
def test_cpu_kernel_sends_patch_rows_to_xgrammar_where_it_can(
    dtype: torch.dtype, strided: bool, monkeypatch: pytest.MonkeyPatch, generator: torch.Generator
) -> None:
    """Patch rows (up to 1/8 of the columns forbidden) of float32/16 and bfloat16 logits with
    contiguous columns go to xgrammar's kernel, by row index; restore and blend rows, float64
    and strided columns stay with guidedec's own paths. Either way the result is the
    reference's, bit for bit."""
    vocab = 129280
    densities = [0.0, 0.005, 0.5, 0.99, 1.0, 0.9, 0.05]
    bitmask = torch.cat(
        [random_bitmask(1, vocab, density=d, generator=generator) for d in densities]
    )
    logits = random_logits(len(densities), vocab, dtype, generator)
    native_rows: list[list[int]] = []
    real = _cpu.apply_token_bitmask_inplace_cpu

    def spy(logits: torch.Tensor, bitmask: torch.Tensor, vocab: int, rows: list[int]) -> None:
        native_rows.append(rows)
        real(logits, bitmask, vocab, rows)

    monkeypatch.setattr(_cpu, "apply_token_bitmask_inplace_cpu", spy)
    expected = applied(logits, bitmask, "torch")
    if strided:  # the same values, every other column of a buffer twice as wide
        wide = torch.empty(len(densities), 2 * vocab, dtype=dtype)
        wide[:, ::2] = logits
        actual = wide[:, ::2]
        apply_bitmask(actual, bitmask, backend="cpu")
    else:
        actual = applied(logits, bitmask, "cpu")
    assert_bit_identical(actual, expected)
    native = dtype != torch.float64 and not strided
    assert native_rows == ([[3, 5]] if native else [])


def test_cpu_plan_ignores_padding_bits_when_counting_allowed_tokens() -> None:
    row = bool_mask_to_bitmask(torch.ones(1, 33, dtype=torch.bool), padding_allowed=False)
    padded = bool_mask_to_bitmask(torch.ones(1, 33, dtype=torch.bool), padding_allowed=True)
    for words in (row, padded):
        plan = _cpu.plan_rows(words.numpy(), 33, np.array([True]))
        assert not (plan.patch | plan.restore | plan.blend).any()


@FAST
@given(
    words=st.integers(1, 9).flatmap(
        lambda width: st.lists(
            st.lists(
                st.sampled_from([0, -1]) | st.integers(-(2**31), 2**31 - 1),
                min_size=width,
                max_size=width,
            ),
            min_size=1,
            max_size=4,
        )
    ),
    data=st.data(),
)
def test_allowed_bit_counts_are_the_set_bits_below_the_columns(
    words: list[list[int]], data: st.DataObject
) -> None:
    """Every way of counting (word pairs, single words, without numpy's ``bitwise_count``, a
    column slice of a wider buffer) gives the set bits below ``num_columns``, per row."""
    from guidedec.bitmask.kernels import common

    array = np.array(words, dtype=np.int32)
    num_columns = data.draw(st.integers(32 * array.shape[1] - 31, 32 * array.shape[1]))
    expected = [sum(1 for t in range(num_columns) if row[t >> 5] >> (t & 31) & 1) for row in words]
    wide = np.zeros((array.shape[0], 2 * array.shape[1]), dtype=np.int32)
    wide[:, ::2] = array
    for view in (array, wide[:, ::2]):
        assert common.count_allowed_bits(view, num_columns).tolist() == expected
    with pytest.MonkeyPatch.context() as patch:
        patch.delattr(np, "bitwise_count", raising=False)
        assert common.count_allowed_bits(array, num_columns).tolist() == expected


def test_cpu_kernel_without_numpy_bitwise_count_matches_reference(
    monkeypatch: pytest.MonkeyPatch, generator: torch.Generator
) -> None:
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    bitmask = mixed_density_bitmask(10, 1001, generator=generator)
    logits = random_logits(10, 1001, torch.float32, generator)
    assert_bit_identical(applied(logits, bitmask, "cpu"), oracle_apply(logits, bitmask))


@st.composite
def apply_cases(
    draw: st.DrawFn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    rows = draw(st.integers(1, 4))
    columns = draw(st.integers(1, 130))
    words = draw(st.integers(1, 5))
    word = st.sampled_from([0, -1]) | st.integers(-(2**31), 2**31 - 1)
    bitmask = torch.tensor(
        draw(
            st.lists(st.lists(word, min_size=words, max_size=words), min_size=rows, max_size=rows)
        ),
        dtype=BITMASK_DTYPE,
    )
    logits = torch.tensor(
        draw(
            st.lists(
                st.floats(-1e4, 1e4, width=32), min_size=rows * columns, max_size=rows * columns
            )
        ),
        dtype=torch.float32,
    ).reshape(rows, columns)
    token_mask = draw(
        st.none() | st.lists(st.booleans(), min_size=rows, max_size=rows).map(torch.tensor)
    )
    offsets = st.lists(
        st.integers(-columns - 2, 32 * words + 2), min_size=columns, max_size=columns
    )
    d2t = draw(st.none() | offsets.map(torch.tensor))
    return logits, bitmask, token_mask, d2t


@FAST
@given(apply_cases())
def test_reference_matches_plain_integer_bit_loop(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
) -> None:
    logits, bitmask, token_mask, d2t = case
    expected = logits.clone()
    words = bitmask.tolist()
    for row in range(logits.shape[0]):
        if token_mask is not None and not token_mask[row]:
            continue
        for column in range(logits.shape[1]):
            target = column + (0 if d2t is None else int(d2t[column]))
            inside = 0 <= target < 32 * len(words[row])
            if not (inside and (words[row][target // 32] >> (target % 32)) & 1):
                expected[row, column] = float("-inf")
    out = applied(logits, bitmask, "torch", token_mask=token_mask, d2t=d2t)
    assert_bit_identical(out, expected)


@FAST
@given(apply_cases())
def test_fast_kernels_match_reference_on_arbitrary_inputs(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
) -> None:
    logits, bitmask, token_mask, d2t = case
    expected = applied(logits, bitmask, "torch", token_mask=token_mask, d2t=d2t)
    for backend in FAST_BACKENDS:
        out = applied(logits, bitmask, backend, token_mask=token_mask, d2t=d2t)
        assert_bit_identical(out, expected)


def test_auto_backend_picks_cpu_kernel_for_cpu_and_reference_elsewhere() -> None:
    assert resolve_backend("auto", torch.device("cpu")) == "cpu"
    assert resolve_backend("auto", torch.device("meta")) == "torch"


def test_kernel_missing_its_optional_dependency_fails_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = KernelSpec("guidedec.bitmask.kernels._not_installed", requires="triton")
    monkeypatch.setitem(KERNELS, "fake", spec)
    assert resolve_backend("fake", torch.device("cpu")) == "fake"
    with pytest.raises(ImportError, match=r"backend 'fake' is unavailable.*'triton'"):
        load_kernel("fake")


def test_unknown_backend_error_names_the_valid_choices() -> None:
    with pytest.raises(ValueError, match=r"'auto', 'torch', 'cpu'"):
        apply_bitmask(torch.zeros(1, 4), torch.zeros(1, 1, dtype=BITMASK_DTYPE), backend="cuda")  # type: ignore[arg-type]


def test_cpu_backend_rejects_tensors_on_another_device() -> None:
    with pytest.raises(ValueError, match="cpu"):
        apply_bitmask(
            torch.zeros(1, 4, device="meta"),
            torch.zeros(1, 1, dtype=BITMASK_DTYPE, device="meta"),
            backend="cpu",
        )


@pytest.mark.parametrize(
    ("logits", "bitmask", "kwargs", "message"),
    [
        (
            torch.zeros(2, 4, dtype=torch.complex64),
            torch.zeros(2, 1, dtype=torch.int32),
            {},
            "float32",
        ),
        (torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32), {}, "float32"),
        (torch.zeros(2, 2, 4), torch.zeros(2, 1, dtype=torch.int32), {}, "2-D"),
        (torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.int64), {}, "int32"),
        (torch.zeros(2, 4), torch.zeros(3, 1, dtype=torch.int32), {}, "rows"),
        (torch.zeros(2, 4), torch.zeros(1, dtype=torch.int32), {}, "bitmask must be"),
        (torch.zeros(2, 4), torch.zeros(2, 0, dtype=torch.int32), {}, "at least one word"),
        (
            torch.zeros(2, 4),
            torch.zeros(2, 1, dtype=torch.int32),
            {"token_mask": torch.ones(2, dtype=torch.int64)},
            "token_mask",
        ),
        (
            torch.zeros(2, 4),
            torch.zeros(2, 1, dtype=torch.int32),
            {"token_mask": torch.ones(3, dtype=torch.int32)},
            "token_mask",
        ),
        (
            torch.zeros(2, 4),
            torch.zeros(2, 1, dtype=torch.int32),
            {"d2t": torch.zeros(4, dtype=torch.float32)},
            "d2t",
        ),
        (
            torch.zeros(2, 4),
            torch.zeros(2, 1, dtype=torch.int32),
            {"d2t": torch.zeros(5, dtype=torch.int64)},
            "d2t",
        ),
        (
            torch.zeros(2, 4),
            torch.zeros(2, 1, dtype=torch.int32),
            {"token_mask": torch.ones(2, dtype=torch.int32, device="meta")},
            "device",
        ),
    ],
)
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_misuse_raises_value_error_with_a_clear_message(
    backend: str,
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    kwargs: dict[str, torch.Tensor],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        apply_bitmask(logits, bitmask, backend=backend, **kwargs)  # type: ignore[arg-type]
