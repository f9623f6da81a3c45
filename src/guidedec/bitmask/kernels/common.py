"""What more than one kernel (and the sparse-row extraction) needs: the logits' integer view,
for writing -inf as a bit pattern, and numpy reads of bitmask words."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from guidedec.bitmask.layout import ALL_ALLOWED_WORD, BITS_PER_WORD

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
WordArray = npt.NDArray[np.int32]

_NO_BITS = 0
_ALL_BITS_BYTE = 0xFF
_POPCOUNT_BYTE = np.array([bin(value).count("1") for value in range(256)], dtype=np.int64)

INT_VIEW = {
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float64: torch.int64,
}
"""The same-width signed integer dtype of each logits dtype."""


def _neg_inf_bits(dtype: torch.dtype) -> int:
    """The bit pattern of -inf in ``dtype``, read as a signed integer of the same width."""
    return int(torch.tensor(float("-inf"), dtype=dtype).view(INT_VIEW[dtype]).item())


NEG_INF_BITS = {dtype: _neg_inf_bits(dtype) for dtype in INT_VIEW}


def int_view(logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Same-size integer view of ``logits`` (same strides) and the bit pattern of -inf in it."""
    return logits.view(INT_VIEW[logits.dtype]), NEG_INF_BITS[logits.dtype]


def covered_words(bitmask: torch.Tensor, num_columns: int) -> WordArray:
    """``[B, ceil(num_columns / 32)]`` C-contiguous little-endian words covering the columns."""
    num_words = -(-num_columns // BITS_PER_WORD)
    words = bitmask.numpy()[:, :num_words]
    return np.ascontiguousarray(words, dtype=np.dtype("<i4"))


def _popcount(words: WordArray) -> npt.NDArray[np.integer[Any]]:
    """Number of set bits of each int32 word (two's complement, so -1 has 32)."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0; counts |x| for signed ints, so go unsigned
        counts: npt.NDArray[np.integer[Any]] = np.bitwise_count(words.view(np.uint32))
        return counts
    as_bytes = np.ascontiguousarray(words, dtype=np.dtype("<i4")).view(np.uint8)
    byte_counts: IntArray = _POPCOUNT_BYTE[as_bytes].reshape(*words.shape, 4)
    word_counts: IntArray = byte_counts.sum(axis=-1)
    return word_counts


def count_allowed_bits(words: WordArray, num_columns: int) -> IntArray:
    """Allowed columns per row: set bits below ``num_columns`` (padding bits do not count)."""
    counts: IntArray
    paired = words.shape[1] - words.shape[1] % 2
    if hasattr(np, "bitwise_count") and paired and words.strides[1] == words.itemsize:
        # Pairs of words as uint64, summed in uint32 (at most 32 * W per row): half the
        # elements to count and a narrower sum, 2.7x faster than per word at V = 129,280.
        pairs = words[:, :paired].view(np.uint64)
        counts = np.add.reduce(np.bitwise_count(pairs), axis=1, dtype=np.uint32).astype(np.int64)
        if paired < words.shape[1]:
            counts += _popcount(words[:, -1])
    else:
        counts = _popcount(words).sum(axis=1, dtype=np.int64)
    tail_bits = num_columns % BITS_PER_WORD
    if tail_bits:
        padding = np.int32(~((1 << tail_bits) - 1))
        counts -= _popcount(words[:, -1] & padding)
    return counts


def bit_positions(
    words: WordArray, rows: BoolArray, *, allowed: bool, num_columns: int
) -> tuple[IntArray, IntArray]:
    """(row, column) int64 arrays of the allowed (or forbidden) columns of the selected rows.

    Only words that hold at least one wanted bit are unpacked, and within them only such bytes.
    """
    skip_word = _NO_BITS if allowed else ALL_ALLOWED_WORD
    skip_byte = _NO_BITS if allowed else _ALL_BITS_BYTE
    flat_words = np.flatnonzero((words != skip_word) & rows[:, None])
    word_bytes = words.reshape(-1)[flat_words].view(np.uint8)  # 4 bytes per word, LSB first
    kept_bytes = np.flatnonzero(word_bytes != skip_byte)
    bits = np.unpackbits(word_bytes[kept_bytes], bitorder="little")
    hits = np.flatnonzero(bits if allowed else bits == 0)
    byte_index = kept_bytes[hits >> 3]  # 8 bits per byte, 4 bytes per word, 32 bits per word
    flat_bits = (flat_words[byte_index >> 2] << 5) | ((byte_index & 3) << 3) | (hits & 7)
    row_index, columns = np.divmod(flat_bits, words.shape[1] * BITS_PER_WORD)
    if num_columns % BITS_PER_WORD:
        inside = columns < num_columns
        row_index, columns = row_index[inside], columns[inside]
    return row_index, columns
