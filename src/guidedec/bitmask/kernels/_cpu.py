"""Fast CPU kernel: work proportional to the minority side of each row.

Real grammar rows are bimodal: a row allows either a handful of tokens (a structural position) or
nearly all of them (inside a string). Each row is planned from its exact count of allowed bits:

- *restore* (few allowed tokens): read the allowed logits, fill the whole row with -inf, write
  them back;
- *patch* (few forbidden tokens): write -inf at the forbidden columns only. For float32,
  bfloat16 and float16 logits with contiguous columns this is xgrammar's compiled CPU kernel, by
  row index (one pass over each row's words, -inf at each forbidden column; the kernel ignores
  column strides, so other logits skip all-allowed words and unpack only the other words in
  numpy). Its branch per column is cheap while almost every token is allowed, so there a row is
  a patch row up to 1/8 of the columns forbidden, elsewhere up to 1/32;
- *blend* (both sides large: a length-bounded string near its end allows only the short tokens):
  one branch-free pass per row. A 256-entry table turns each bitmask byte into eight words of 0
  or -1 (allowed), and the row becomes ``(logits & keep) | (-inf & ~keep)`` in integer
  arithmetic: 90 µs a row at V = 129,280 whatever the density, where xgrammar's kernel takes
  170 to 470 µs (a mispredicted branch per column) and unpacking the bits for ``masked_fill_``
  over 500 µs.

Everything works on an integer view of the logits (same strides), so allowed entries are copied
bit for bit (NaN payloads included) and masked entries get the exact -inf bit pattern of the
dtype. Index arithmetic and the writes run in numpy: cheap on small arrays, and single-threaded,
which keeps the kernel steady on a busy machine where torch's intra-op threads stall. The writes
bypass autograd (logits are sampled, not differentiated). With a ``d2t`` remapping the kernel
uses the reference formulation (:mod:`._torch`), whose cost is proportional to ``B * C``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from xgrammar.kernels.apply_token_bitmask_inplace_cpu import apply_token_bitmask_inplace_cpu

from guidedec.bitmask.kernels import _torch
from guidedec.bitmask.kernels.common import (
    NEG_INF_BITS,
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
_NATIVE_PATCH_DIVISOR = 8
"""A row is patched by xgrammar's kernel up to ``num_columns / 8`` forbidden columns: there it
is faster than the blend (measured: 39 against 89 µs a row at 3% forbidden, 102 against 86 at
15%)."""
_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes xgrammar's CPU kernel takes, for the patch rows."""


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
    active = active_rows(token_mask, logits.shape[0])
    if not active.any():
        return
    planned = PlannedMask.of(logits, bitmask, active)
    planned.apply_inplace(logits, active, bitmask=bitmask)


@dataclass(slots=True)
class PlannedMask:
    """A bitmask read for one apply: its words over the covered columns and each row's plan."""

    words: WordArray
    num_columns: int
    active: BoolArray
    plan: RowPlan
    native: bool  # patch rows go to xgrammar's kernel

    @classmethod
    def of(cls, logits: torch.Tensor, bitmask: torch.Tensor, active: BoolArray) -> PlannedMask:
        num_columns = min(logits.shape[1], bitmask.shape[1] * BITS_PER_WORD)
        words = covered_words(bitmask, num_columns)
        # xgrammar's kernel reads and writes each row as if its columns were contiguous.
        native = logits.dtype in _NATIVE_DTYPES and logits.stride(1) == 1 and bitmask.stride(1) == 1
        divisor = _NATIVE_PATCH_DIVISOR if native else _SPARSE_DIVISOR
        plan = plan_rows(words, num_columns, active, patch_divisor=divisor)
        return cls(words, num_columns, active, plan, native)

    def apply_inplace(
        self,
        logits: torch.Tensor,
        rows: BoolArray,
        *,
        bitmask: torch.Tensor | None = None,
        source: LogitsArray | None = None,
    ) -> None:
        """Mask the selected active rows of ``logits`` in place by their plan; with ``source``
        (an integer view of other logits of the same shape), blend rows are written from it
        instead, and the caller has copied the other selected rows. ``bitmask`` is the tensor
        the words came from (xgrammar's kernel reads it), required for native patch rows."""
        int_array: LogitsArray = int_view(logits)[0].numpy()  # shares memory with logits
        neg_inf = NEG_INF_BITS[logits.dtype]
        plan, words, num_columns = self.plan, self.words, self.num_columns
        _mask_uncovered_columns(int_array, self.active & rows, num_columns, neg_inf)
        _restore_rows(int_array, words, plan.restore & rows, num_columns, neg_inf)
        if self.native:
            assert bitmask is not None
            _native_rows(logits, bitmask, plan.patch & rows, num_columns)
        else:
            _patch_rows(int_array, words, plan.patch & rows, num_columns, neg_inf)
        _blend_rows(int_array, words, plan.blend & rows, num_columns, neg_inf, source)


@dataclass(slots=True)
class RowPlan:
    """Disjoint ``[B]`` bool selections of the rows each strategy handles.

    Active rows that allow every covered column are in none of them.
    """

    patch: BoolArray
    restore: BoolArray
    blend: BoolArray


def plan_rows(
    words: WordArray, num_columns: int, active: BoolArray, *, patch_divisor: int = _SPARSE_DIVISOR
) -> RowPlan:
    """Pick the cheapest strategy per active row from its exact allowed-bit count.

    A row is restored when at most ``num_columns / 32`` columns are allowed (and fewer than are
    forbidden), patched when at most ``num_columns / patch_divisor`` are forbidden (and some
    are), and blended otherwise.
    """
    allowed = count_allowed_bits(words, num_columns)
    forbidden = num_columns - allowed
    restore = active & (allowed * _SPARSE_DIVISOR <= num_columns) & (allowed < forbidden)
    patch = active & ~restore & (forbidden > 0) & (forbidden * patch_divisor <= num_columns)
    return RowPlan(patch=patch, restore=restore, blend=active & ~restore & ~patch & (forbidden > 0))


def active_rows(token_mask: torch.Tensor | None, num_rows: int) -> BoolArray:
    """``[B]`` bool: the rows ``token_mask`` selects (every row without one)."""
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


def _blend_rows(
    int_array: LogitsArray,
    words: WordArray,
    rows: BoolArray,
    num_columns: int,
    neg_inf: int,
    source: LogitsArray | None = None,
) -> None:
    """Each selected row, in one branch-free pass: ``(row & keep) | (-inf & ~keep)``, with
    ``keep`` (0 or -1 per column) looked up eight columns at a time from the bitmask's bytes;
    with ``source``, the row is read from there (``int_array``'s row is only written)."""
    row_ids = np.flatnonzero(rows).tolist()
    if not row_ids:
        return
    dtype = int_array.dtype
    table = _keep_table(dtype.str)
    num_bytes = -(-num_columns // 8)
    keep_bytes = np.empty((num_bytes, 8), dtype=dtype)  # one row at a time: it stays in cache
    keep = keep_bytes.reshape(-1)[:num_columns]
    neg = dtype.type(neg_inf)
    word_bytes = words.view(np.uint8)  # little-endian words: byte k holds columns 8k to 8k + 7
    for row_id in row_ids:
        row = int_array[row_id, :num_columns]
        read = row if source is None else source[row_id, :num_columns]
        np.take(table, word_bytes[row_id, :num_bytes], axis=0, out=keep_bytes)
        np.bitwise_and(read, keep, out=row)
        np.invert(keep, out=keep)
        np.bitwise_and(keep, neg, out=keep)
        np.bitwise_or(row, keep, out=row)


@functools.cache
def _keep_table(dtype: str) -> LogitsArray:
    """``[256, 8]``: for each byte value, its bits (least significant first) as 0 or -1."""
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
    table: LogitsArray = -bits.astype(np.dtype(dtype))
    return table
