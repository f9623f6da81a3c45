"""Fast CPU kernel: work proportional to the minority side of each row.

Real grammar rows are bimodal: a row allows either a handful of tokens (a structural position) or
nearly all of them (inside a string). Each row is planned from its exact count of allowed bits:

- *patch* (few forbidden tokens): skip all-allowed words, unpack only the other words and write
  -inf at the forbidden columns;
- *restore* (few allowed tokens): read the allowed logits, fill the whole row with -inf, write
  them back;
- *dense* (neither side is small): unpack the whole row and ``masked_fill_`` it.

For float32, bfloat16 and float16 logits the patch and dense rows go instead to xgrammar's
compiled CPU kernel (one pass over each row's words, writing -inf at each forbidden column; no
bit array is unpacked), by row index, where logits and bitmask have contiguous columns (the
kernel ignores column strides). It is two to three times faster on those rows; the restore rows,
which it would walk column by column, stay here.

Everything works on an integer view of the logits (same strides), so allowed entries are copied
bit for bit (NaN payloads included) and masked entries get the exact -inf bit pattern of the
dtype. Index arithmetic and the sparse writes run in numpy: cheap on small arrays, and
single-threaded, which keeps the kernel steady on a busy machine where torch's intra-op threads
stall. The writes bypass autograd (logits are sampled, not differentiated). With a ``d2t``
remapping the kernel uses the reference formulation (:mod:`._torch`), whose cost is
proportional to ``B * C``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from xgrammar.kernels.apply_token_bitmask_inplace_cpu import apply_token_bitmask_inplace_cpu

from guidedec.bitmask.kernels import _torch
from guidedec.bitmask.kernels.common import (
    BoolArray,
    WordArray,
    bit_positions,
    count_allowed_bits,
    covered_words,
    int_view,
)
from guidedec.bitmask.layout import BITS_PER_WORD

LogitsArray = npt.NDArray[np.signedinteger[Any]]  # int32 or int16 view of the logits

# A row is sparse when its minority side (allowed or forbidden columns) is at most 1/32 of the
# columns: one sparse bit costs ~15-50 ns, one dense column ~1-2 ns (measured, V = 129,280).
_SPARSE_DIVISOR = 32
_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes xgrammar's CPU kernel takes, for the patch and dense rows."""


def apply_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    token_mask: torch.Tensor | None,
    d2t: torch.Tensor | None,
) -> None:
    """Set every logit whose token the bitmask forbids to -inf, in place (see the package docs)."""
    if d2t is not None:
        _torch.apply_bitmask_inplace(logits, bitmask, token_mask, d2t)
        return
    active = _active_rows(token_mask, logits.shape[0])
    if not active.any():
        return
    int_logits, neg_inf = int_view(logits)
    int_array: LogitsArray = int_logits.numpy()  # shares memory and strides with logits
    num_columns = min(logits.shape[1], bitmask.shape[1] * BITS_PER_WORD)
    words = covered_words(bitmask, num_columns)
    _mask_uncovered_columns(int_array, active, num_columns, neg_inf)
    plan = plan_rows(words, num_columns, active)
    _restore_rows(int_array, words, plan.restore, num_columns, neg_inf)
    # xgrammar's kernel reads and writes each row as if its columns were contiguous.
    if logits.dtype in _NATIVE_DTYPES and logits.stride(1) == 1 and bitmask.stride(1) == 1:
        _native_rows(logits, bitmask, plan.patch | plan.dense, num_columns)
        return
    _patch_rows(int_array, words, plan.patch, num_columns, neg_inf)
    _dense_rows(int_logits, words, plan.dense, num_columns, neg_inf)


@dataclass(slots=True)
class RowPlan:
    """Disjoint ``[B]`` bool selections of the rows each strategy handles.

    Active rows that allow every covered column are in none of them.
    """

    patch: BoolArray
    restore: BoolArray
    dense: BoolArray


def plan_rows(words: WordArray, num_columns: int, active: BoolArray) -> RowPlan:
    """Pick the cheapest strategy per active row from its exact allowed-bit count.

    A row is sparse when its minority side is at most ``num_columns / 32`` columns: it is
    restored when fewer columns are allowed than forbidden, patched otherwise (unless nothing
    is forbidden). Every other active row is dense.
    """
    allowed = count_allowed_bits(words, num_columns)
    forbidden = num_columns - allowed
    sparse = active & (np.minimum(allowed, forbidden) * _SPARSE_DIVISOR <= num_columns)
    restore = sparse & (allowed < forbidden)
    return RowPlan(
        patch=sparse & ~restore & (forbidden > 0), restore=restore, dense=active & ~sparse
    )


def _active_rows(token_mask: torch.Tensor | None, num_rows: int) -> BoolArray:
    if token_mask is None:
        return np.ones(num_rows, dtype=np.bool_)
    return np.asarray(token_mask.numpy() != 0, dtype=np.bool_)


def _mask_uncovered_columns(
    int_array: LogitsArray, active: BoolArray, num_columns: int, neg_inf: int
) -> None:
    """Columns at or past ``32 * W`` have no bit: they are always masked."""
    if int_array.shape[1] > num_columns:
        for row in np.flatnonzero(active).tolist():
            int_array[row, num_columns:] = neg_inf


def _patch_rows(
    int_array: LogitsArray, words: WordArray, rows: BoolArray, num_columns: int, neg_inf: int
) -> None:
    """Write -inf at the few forbidden columns of each selected row."""
    if not rows.any():
        return
    index = bit_positions(words, rows, allowed=False, num_columns=num_columns)
    int_array[index] = neg_inf


def _restore_rows(
    int_array: LogitsArray, words: WordArray, rows: BoolArray, num_columns: int, neg_inf: int
) -> None:
    """Fill each selected row with -inf, keeping its few allowed logits."""
    if not rows.any():
        return
    index = bit_positions(words, rows, allowed=True, num_columns=num_columns)
    kept = int_array[index]
    for row in np.flatnonzero(rows).tolist():
        int_array[row].fill(neg_inf)
    int_array[index] = kept


def _native_rows(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: BoolArray, num_columns: int
) -> None:
    """The selected rows through xgrammar's CPU kernel (columns below ``num_columns``)."""
    row_ids = np.flatnonzero(rows).tolist()
    if row_ids:
        apply_token_bitmask_inplace_cpu(logits, bitmask, num_columns, row_ids)


def _dense_rows(
    int_logits: torch.Tensor, words: WordArray, rows: BoolArray, num_columns: int, neg_inf: int
) -> None:
    """Unpack every bit of each selected row and mask it with ``masked_fill_``."""
    row_ids = np.flatnonzero(rows)
    if row_ids.size == 0:
        return
    bits = np.unpackbits(words[row_ids].view(np.uint8), axis=1, bitorder="little")
    forbidden = torch.from_numpy(bits[:, :num_columns] == 0)
    for position, row in enumerate(row_ids.tolist()):
        int_logits[row, :num_columns].masked_fill_(forbidden[position], neg_inf)
