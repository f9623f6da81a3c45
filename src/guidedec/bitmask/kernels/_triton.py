"""Triton kernel: one program per (row, block of columns), writes only, never reads a logit.

Without ``d2t`` a program loads ``BLOCK_WORDS`` bitmask words, expands them to a
``[BLOCK_WORDS, 32]`` tile of columns and stores -inf with the store mask "bit is 0 and the
column exists". So an all-allowed word (-1) costs no logits traffic at all, an all-forbidden word
is a plain write of -inf, and a mixed word writes only its forbidden lanes: allowed entries are
never read nor rewritten, which keeps them bit for bit (NaN payloads included) with no
read-modify-write. Columns at or past ``32 * W`` read their word as 0 (a masked load), so they
are masked; bits at or past the logits width have no column and are ignored.

With ``d2t`` column ``j`` stands for target ``j + d2t[j]``, so neighbouring columns no longer share
a word: a second kernel gathers one bit per column, and a target outside ``[0, 32 * W)`` reads as
forbidden.

A row whose ``token_mask`` entry is 0 returns before it reads the bitmask. The logits are
addressed through an integer view of the same width (int16/int32/int64), so every float dtype
(float64 included) uses the same code and -inf is the exact bit pattern of the dtype. Offsets are
computed in int64.

CUDA tensors run the compiled kernel (or the interpreter when ``TRITON_INTERPRET=1`` was set when
the kernel was first used). CPU tensors, which the registry lets through only under
``TRITON_INTERPRET=1``, always run Triton's interpreter: that is how the kernel is tested without
a GPU.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from guidedec.bitmask.kernels.common import int_view
from guidedec.bitmask.layout import BITS_PER_WORD

BLOCK_WORDS = 32  # 1024 columns per program: ~130 programs per row of a 129k vocabulary
BLOCK_COLUMNS = BLOCK_WORDS * BITS_PER_WORD
NUM_WARPS = 4


def _mask_by_words(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    token_mask_ptr,
    num_columns,
    num_words,
    logits_row_stride,
    logits_column_stride,
    bitmask_row_stride,
    bitmask_word_stride,
    neg_inf: tl.constexpr,
    has_token_mask: tl.constexpr,
    block_words: tl.constexpr,
    bits_per_word: tl.constexpr,
):
    """Store ``neg_inf`` at every forbidden column of one block of ``block_words`` words."""
    row = tl.program_id(0).to(tl.int64)
    if has_token_mask and tl.load(token_mask_ptr + row) == 0:  # a constexpr `and` short-circuits
        return
    words = tl.program_id(1).to(tl.int64) * block_words + tl.arange(0, block_words)
    word_bits = tl.load(
        bitmask_ptr + row * bitmask_row_stride + words * bitmask_word_stride,
        mask=words < num_words,
        other=0,  # a missing word forbids its columns: columns past 32 * W are masked
    )
    bit_index = tl.arange(0, bits_per_word)
    columns = words[:, None] * bits_per_word + bit_index[None, :]  # [block_words, 32] tile
    allowed = (word_bits[:, None] >> bit_index[None, :]) & 1  # LSB first; >> keeps bit 31
    forbidden = (allowed == 0) & (columns < num_columns)
    logits_row = logits_ptr + row * logits_row_stride
    tl.store(logits_row + columns * logits_column_stride, neg_inf, mask=forbidden)


def _mask_by_targets(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    token_mask_ptr,
    d2t_ptr,
    num_columns,
    num_words,
    logits_row_stride,
    logits_column_stride,
    bitmask_row_stride,
    bitmask_word_stride,
    d2t_stride,
    neg_inf: tl.constexpr,
    has_token_mask: tl.constexpr,
    block_columns: tl.constexpr,
    bits_per_word: tl.constexpr,
):
    """Store ``neg_inf`` at every column of one block whose target ``j + d2t[j]`` is forbidden."""
    row = tl.program_id(0).to(tl.int64)
    if has_token_mask and tl.load(token_mask_ptr + row) == 0:  # a constexpr `and` short-circuits
        return
    columns = tl.program_id(1).to(tl.int64) * block_columns + tl.arange(0, block_columns)
    inside = columns < num_columns
    offsets = tl.load(d2t_ptr + columns * d2t_stride, mask=inside, other=0)
    targets = columns + offsets.to(tl.int64)
    covered = inside & (targets >= 0) & (targets < num_words * bits_per_word)
    safe_targets = tl.where(covered, targets, 0)  # no out-of-range address or shift amount
    words = safe_targets // bits_per_word
    word_bits = tl.load(
        bitmask_ptr + row * bitmask_row_stride + words * bitmask_word_stride,
        mask=covered,
        other=0,  # an uncovered target is forbidden
    )
    allowed = (word_bits >> (safe_targets % bits_per_word).to(tl.int32)) & 1
    logits_row = logits_ptr + row * logits_row_stride
    tl.store(logits_row + columns * logits_column_stride, neg_inf, mask=inside & (allowed == 0))


@functools.cache
def _launchable(kernel: Callable[..., None], interpreted: bool) -> Any:
    """``kernel`` as Triton's interpreter runs it (for CPU tensors) or as ``triton.jit`` makes it.

    Built on first use, so an interpreted CPU run and a compiled CUDA run can share one process.
    """
    if interpreted:
        from triton.runtime.interpreter import InterpretedFunction  # type: ignore[import-untyped]

        return InterpretedFunction(kernel)
    return triton.jit(kernel)


def apply_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    token_mask: torch.Tensor | None,
    d2t: torch.Tensor | None,
) -> None:
    """Set every logit whose token the bitmask forbids to -inf, in place (see the package docs)."""
    int_logits, neg_inf = int_view(logits)
    gate = None if token_mask is None else token_mask.to(torch.int32).contiguous()
    interpreted = logits.device.type == "cpu"
    num_rows, num_columns = logits.shape
    grid = (num_rows, triton.cdiv(num_columns, BLOCK_COLUMNS))
    shared = (int_logits, bitmask, gate)
    sizes_and_strides = (num_columns, bitmask.shape[1], *int_logits.stride(), *bitmask.stride())
    options = {
        "neg_inf": neg_inf,
        "has_token_mask": gate is not None,
        "bits_per_word": BITS_PER_WORD,
        "num_warps": NUM_WARPS,
    }
    with _on_device(logits.device):
        if d2t is None:
            kernel = _launchable(_mask_by_words, interpreted)
            kernel[grid](*shared, *sizes_and_strides, block_words=BLOCK_WORDS, **options)
        else:
            kernel = _launchable(_mask_by_targets, interpreted)
            kernel[grid](
                *shared,
                d2t,
                *sizes_and_strides,
                d2t.stride(0),
                block_columns=BLOCK_COLUMNS,
                **options,
            )


def _on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make ``device`` current for the launch (Triton launches on the current CUDA device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
