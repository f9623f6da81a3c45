"""The Triton kernel is bit-exact against the torch reference: on the CPU through Triton's
interpreter, and on CUDA (``gpu`` tests) as compiled code.

Triton 3.9 reads ``TRITON_INTERPRET`` in ``triton.jit``, when a kernel is decorated, and never at
launch. The kernel module does not rely on it: it decorates lazily and always hands CPU tensors to
the interpreter. The variable only gates ``backend="triton"`` for CPU tensors in the registry, read
on each call, so the CPU tests set it with ``monkeypatch`` (the ``interpret`` fixture): it does not
leak into other test modules, and the ``gpu`` tests here run the compiled kernel.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the Triton kernel needs the optional triton package")

from test_apply_kernels import (
    apply_cases,
    assert_bit_identical,
    bits_of,
    random_logits,
    strided_view,
)

from guidedec.bitmask import BITMASK_DTYPE, apply_bitmask
from guidedec.bitmask.kernels import _triton, resolve_backend
from guidedec.testing import bool_mask_to_bitmask, mixed_density_bitmask, random_bitmask

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
VOCABS = [1, 31, 32, 33, 1000, 4099]  # 4099 spans five 1024-column blocks
DENSITIES = [0.0, 0.01, 0.5, 0.99, 1.0]
INTERPRET = "TRITON_INTERPRET"
CPU = torch.device("cpu")


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``backend="triton"`` take CPU tensors (run by the interpreter) for one test."""
    monkeypatch.setenv(INTERPRET, "1")


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(4321)


def masked(
    logits: torch.Tensor, bitmask: torch.Tensor, backend: str, **kwargs: torch.Tensor | None
) -> torch.Tensor:
    """A copy of ``logits`` masked by ``backend`` (the input is left as it is)."""
    out = logits.clone()
    apply_bitmask(out, bitmask, backend=backend, **kwargs)  # type: ignore[arg-type]
    return out


def assert_matches_reference(
    logits: torch.Tensor, bitmask: torch.Tensor, **kwargs: torch.Tensor | None
) -> torch.Tensor:
    out = masked(logits, bitmask, "triton", **kwargs)
    assert_bit_identical(out, masked(logits, bitmask, "torch", **kwargs))
    return out


def nan_payload(dtype: torch.dtype) -> int:
    """A NaN with a non-default payload, as the integer that holds its bits."""
    return {torch.float32: 0x7FC0_1234, torch.float64: 0x7FF8_0000_0000_1234}.get(dtype, 0x7E12)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_reference_bit_for_bit(
    density: float, vocab: int, dtype: torch.dtype, generator: torch.Generator
) -> None:
    bitmask = random_bitmask(3, vocab, density=density, generator=generator)
    out = assert_matches_reference(random_logits(3, vocab, dtype, generator), bitmask)
    if density in (0.0, 1.0):
        assert bool(torch.isneginf(out).all()) == (density == 0.0)
        assert bool(torch.isneginf(out).any()) == (density == 0.0)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("block_size", [8, 40])
def test_triton_handles_runs_of_whole_words(block_size: int, generator: torch.Generator) -> None:
    bitmask = random_bitmask(2, 4099, density=0.5, generator=generator, block_size=block_size)
    assert_matches_reference(random_logits(2, 4099, torch.float32, generator), bitmask)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("mask_dtype", [None, torch.int32, torch.bool])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_with_zero_token_mask_are_untouched_including_nan_payloads(
    mask_dtype: torch.dtype | None, dtype: torch.dtype, generator: torch.Generator
) -> None:
    logits = random_logits(5, 1000, dtype, generator)
    bits_of(logits)[:, ::7] = nan_payload(dtype)
    bitmask = mixed_density_bitmask(5, 1000, generator=generator)
    token_mask = None if mask_dtype is None else torch.tensor([1, 0, 1, 0, 0], dtype=mask_dtype)
    out = assert_matches_reference(logits, bitmask, token_mask=token_mask)
    if token_mask is not None:
        assert_bit_identical(out[1::2], logits[1::2])
        assert_bit_identical(out[4], logits[4])
    allowed = ~torch.isneginf(out)
    assert_bit_identical(out[allowed], logits[allowed])  # NaN payloads kept where allowed


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 1.0])
@pytest.mark.parametrize("d2t_dtype", [torch.int32, torch.int64])
def test_d2t_gathers_the_bit_of_each_target_and_masks_targets_outside_the_bitmask(
    density: float, d2t_dtype: torch.dtype, generator: torch.Generator
) -> None:
    draft_vocab, target_vocab = 2500, 5000  # three blocks of draft columns
    targets = torch.randperm(target_vocab + 200, generator=generator)[:draft_vocab] - 100
    d2t = (targets - torch.arange(draft_vocab)).to(d2t_dtype)  # some targets < 0 or >= 32 * W
    bitmask = random_bitmask(3, target_vocab, density=density, generator=generator)
    logits = random_logits(3, draft_vocab, torch.bfloat16, generator)
    token_mask = torch.tensor([True, False, True])
    out = assert_matches_reference(logits, bitmask, d2t=d2t, token_mask=token_mask)
    outside = (targets < 0) | (targets >= bitmask.shape[1] * 32)
    assert bool(outside.any()) and bool(torch.isneginf(out[0, outside]).all())
    assert_bit_identical(out[1], logits[1])
    strided_d2t = torch.stack([d2t, d2t], dim=1)[:, 0]
    assert strided_d2t.stride() == (2,)
    assert_matches_reference(logits, bitmask, d2t=strided_d2t)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize(
    "layout", ["column_slice", "every_other_row", "column_major", "row_and_column_step"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_d2t", [False, True])
def test_strided_logits_are_masked_in_place_and_the_rest_untouched(
    layout: str, dtype: torch.dtype, with_d2t: bool, generator: torch.Generator
) -> None:
    vocab = 1000
    shape = (2 * vocab + 8, 12) if layout == "column_major" else (12, 2 * vocab + 8)
    base = random_logits(*shape, dtype, generator)
    expected = base.clone()
    view = strided_view(base, layout, vocab)
    assert not view.is_contiguous()
    bitmask = mixed_density_bitmask(view.shape[0], vocab, generator=generator)
    d2t = torch.randint(-40, 40, (vocab,), generator=generator) if with_d2t else None
    apply_bitmask(strided_view(expected, layout, vocab), bitmask, d2t=d2t, backend="torch")
    apply_bitmask(view, bitmask, d2t=d2t, backend="triton")
    assert_bit_identical(base, expected)


@pytest.mark.usefixtures("interpret")
def test_non_contiguous_bitmask_is_read_correctly(generator: torch.Generator) -> None:
    bitmask = mixed_density_bitmask(10, 1100, generator=generator)[::2, :32]  # row stride 35
    assert_matches_reference(random_logits(5, 1000, torch.float32, generator), bitmask)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("density", [0.0, 0.5, 1.0])
def test_logit_columns_beyond_the_bitmask_are_masked(
    density: float, generator: torch.Generator
) -> None:
    bitmask = random_bitmask(3, 64, density=density, generator=generator)  # covers 64 columns
    logits = random_logits(3, 1100, torch.float16, generator)  # a second block past the words
    out = assert_matches_reference(logits, bitmask, token_mask=torch.tensor([1, 0, 1]).int())
    assert bool(torch.isneginf(out[::2, 64:]).all())
    assert_bit_identical(out[1], logits[1])


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("vocab", [1, 31, 33, 1000])
def test_bitmask_bits_beyond_the_logits_are_ignored(vocab: int, generator: torch.Generator) -> None:
    bitmask = mixed_density_bitmask(5, vocab + 70, generator=generator)
    tail = bool_mask_to_bitmask(torch.arange(bitmask.shape[1] * 32) >= vocab)
    logits = random_logits(5, vocab, torch.float32, generator)
    expected = masked(logits, bitmask, "torch")
    for variant in (bitmask, bitmask & ~tail, bitmask | tail):
        assert_bit_identical(masked(logits, variant, "triton"), expected)


@pytest.mark.usefixtures("interpret")
def test_one_dimensional_logits_and_bitmask_are_one_row(generator: torch.Generator) -> None:
    bitmask = random_bitmask(1, 100, density=0.5, generator=generator)[0]
    assert_matches_reference(random_logits(1, 100, torch.float16, generator)[0], bitmask)


@st.composite
def triton_cases(
    draw: st.DrawFn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`test_apply_kernels.apply_cases` in any float dtype, maybe as a strided view."""
    logits, bitmask, token_mask, d2t = draw(apply_cases())
    logits = logits.to(draw(st.sampled_from(DTYPES)))
    if draw(st.booleans()):  # the same values in every other column of a wider tensor
        wide = torch.zeros(logits.shape[0], 2 * logits.shape[1], dtype=logits.dtype)
        wide[:, ::2] = logits
        logits = wide[:, ::2]
    if token_mask is not None and draw(st.booleans()):
        token_mask = token_mask.to(torch.int32)
    if d2t is not None and draw(st.booleans()):
        d2t = d2t.to(torch.int32)
    return logits, bitmask, token_mask, d2t


@pytest.mark.usefixtures("interpret")
@settings(max_examples=25, deadline=None)
@given(triton_cases())
def test_triton_matches_reference_on_arbitrary_inputs(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
) -> None:
    logits, bitmask, token_mask, d2t = case
    assert_matches_reference(logits, bitmask, token_mask=token_mask, d2t=d2t)


@pytest.mark.parametrize("value", [None, "0", "", "false"])
def test_triton_rejects_cpu_tensors_unless_interpreting(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(INTERPRET, raising=False)
    else:
        monkeypatch.setenv(INTERPRET, value)
    with pytest.raises(ValueError, match=r"'triton' runs on cuda tensors.*TRITON_INTERPRET=1"):
        apply_bitmask(torch.zeros(1, 4), torch.zeros(1, 1, dtype=BITMASK_DTYPE), backend="triton")
    assert resolve_backend("auto", CPU) == "cpu"


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_interpreter_flag_admits_cpu_tensors_but_auto_keeps_the_cpu_kernel(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(INTERPRET, value)
    assert resolve_backend("triton", CPU) == "triton"
    assert resolve_backend("auto", CPU) == "cpu"


def test_auto_picks_triton_for_cuda_tensors() -> None:
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_backend("triton", torch.device("cuda", 1)) == "triton"


def kernel_signature(kernel: str, logits_dtype: str) -> tuple[dict[str, str], dict[str, object]]:
    """Triton signature and constexprs of one kernel, as ``triton.compile`` takes them."""
    pointers = {"logits_ptr": f"*{logits_dtype}", "bitmask_ptr": "*i32", "token_mask_ptr": "*i32"}
    scalars = ["num_columns", "num_words", "logits_row_stride", "logits_column_stride"]
    scalars += ["bitmask_row_stride", "bitmask_word_stride"]
    if kernel == "targets":
        pointers["d2t_ptr"] = "*i64"
        scalars.append("d2t_stride")
    block = ("block_columns", 1024) if kernel == "targets" else ("block_words", 32)
    constexprs: dict[str, object] = {
        "neg_inf": -1024,
        "has_token_mask": True,
        block[0]: block[1],
        "bits_per_word": 32,
    }
    signature = {
        **pointers,
        **dict.fromkeys(scalars, "i32"),
        **dict.fromkeys(constexprs, "constexpr"),
    }
    return signature, constexprs


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("kernel", ["words", "targets"])
def test_kernels_compile_for_a_cuda_gpu_without_one(kernel: str) -> None:
    """Lower to a Hopper cubin on the CPU: catches what the interpreter accepts but the compiler
    does not (Triton's bundled ptxas needs no GPU)."""
    import triton  # type: ignore[import-untyped]
    from triton.backends import backends  # type: ignore[import-untyped]
    from triton.backends.compiler import GPUTarget  # type: ignore[import-untyped]
    from triton.compiler import ASTSource  # type: ignore[import-untyped]
    from triton.runtime import JITFunction  # type: ignore[import-untyped]

    if "nvidia" not in backends:
        pytest.skip("this Triton build has no CUDA backend")
    function = _triton._mask_by_targets if kernel == "targets" else _triton._mask_by_words
    signature, constexprs = kernel_signature(kernel, "i16")
    # JITFunction, not triton.jit: the latter returns the interpreter under TRITON_INTERPRET=1.
    source = ASTSource(fn=JITFunction(function), signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"]


@pytest.mark.gpu
@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_kernel_matches_reference_on_cuda(
    density: float, dtype: torch.dtype, generator: torch.Generator
) -> None:
    vocab = 129_280
    bitmask = random_bitmask(8, vocab, density=density, generator=generator).cuda()
    logits = random_logits(8, vocab + 64, dtype, generator).cuda()
    bits_of(logits)[:, ::5] = nan_payload(dtype)
    token_mask = torch.tensor([1, 1, 0, 1, 1, 1, 0, 1], dtype=torch.bool, device="cuda")
    for kwargs in ({}, {"token_mask": token_mask}):
        out = masked(logits, bitmask, "auto", **kwargs)
        assert_bit_identical(out, masked(logits, bitmask, "torch", **kwargs))


@pytest.mark.gpu
@pytest.mark.parametrize("d2t_dtype", [torch.int32, torch.int64])
def test_compiled_kernel_matches_reference_on_cuda_with_d2t_and_strides(
    d2t_dtype: torch.dtype, generator: torch.Generator
) -> None:
    draft_vocab, target_vocab = 32_000, 129_280
    targets = torch.randperm(target_vocab, generator=generator)[:draft_vocab].sort().values
    d2t = (targets - torch.arange(draft_vocab)).to(d2t_dtype).cuda()
    bitmask = mixed_density_bitmask(6, target_vocab, generator=generator).cuda()
    base = random_logits(12, 2 * draft_vocab, torch.bfloat16, generator).cuda()
    view = base[::2, 5 : 5 + draft_vocab]
    expected = base.clone()
    apply_bitmask(expected[::2, 5 : 5 + draft_vocab], bitmask, d2t=d2t, backend="torch")
    apply_bitmask(view, bitmask, d2t=d2t, backend="triton")
    assert_bit_identical(base, expected)
