"""The token bitmask layout: one place for every fact about it.

A bitmask row covers a (padded) vocabulary of ``V`` tokens with ``ceil(V / 32)`` int32 words.
Token ``t`` is bit ``t % 32`` (least significant bit first) of word ``t // 32``; a set bit means
the token is **allowed**. Bits at or past ``V`` in the last word are padding: nothing reads them,
and backends are not required to clear them.
"""

from __future__ import annotations

import numpy as np
import torch

try:  # numpy's C function, without the Python dispatch of np.count_nonzero (0.4 us per call)
    from numpy._core.multiarray import count_nonzero as _count_nonzero
except ImportError:  # pragma: no cover - numpy < 2
    _count_nonzero = np.count_nonzero

BITS_PER_WORD = 32
BITMASK_DTYPE = torch.int32
ALL_ALLOWED_WORD = -1  # int32 with every bit set


def token_word(token: int) -> int:
    """The int32 value of the word that allows ``token`` alone within its word (bit
    ``token % 32``): ``bitmask[row, token // 32] = token_word(token)``."""
    bit = 1 << (token % BITS_PER_WORD)
    return bit - (1 << 32) if bit >= 1 << 31 else bit


def bitmask_size(vocab_size: int) -> int:
    """Number of int32 words in one bitmask row for ``vocab_size`` tokens: ``ceil(V / 32)``."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def allocate_bitmask(
    rows: int,
    vocab_size: int,
    *,
    device: str | torch.device = "cpu",
    pin_memory: bool = False,
) -> torch.Tensor:
    """Allocate a ``[rows, ceil(vocab_size / 32)]`` int32 bitmask with every token allowed.

    ``pin_memory`` pins a host buffer so that host-to-device copies can be asynchronous; it is
    ignored (with the buffer left pageable) where no accelerator is present.
    """
    if rows < 0:
        raise ValueError(f"rows must be non-negative, got {rows}")
    pin = pin_memory and torch.device(device).type == "cpu" and torch.cuda.is_available()
    return torch.full(
        (rows, bitmask_size(vocab_size)),
        ALL_ALLOWED_WORD,
        dtype=BITMASK_DTYPE,
        device=device,
        pin_memory=pin,
    )


def row_has_valid_token(row: torch.Tensor, vocab_size: int) -> bool:
    """Whether a filled bitmask row allows at least one token below ``vocab_size``.

    A row with no allowed token is a grammar dead end: applying it would set the whole logits row
    to -inf and softmax would return NaN. Only bits below ``vocab_size`` count; padding bits of the
    last word are ignored, exactly as the apply kernels ignore them.
    """
    num_full_words, num_tail_bits = divmod(vocab_size, BITS_PER_WORD)
    if bool(row[:num_full_words].any()):
        return True
    if num_tail_bits == 0:
        return False
    return bool(int(row[num_full_words]) & ((1 << num_tail_bits) - 1))


PROBE_WORDS = 16
"""Words (512 tokens) that :class:`HostRowChecker` looks at before it scans a whole row."""


class HostRowChecker:
    """:func:`row_has_valid_token` for the rows of one host bitmask buffer, without torch's
    per-call dispatch (under 1 us a row instead of 8 at V = 129,280): the decoder runs it on
    every row it fills. It reads the buffer live, through numpy views made once.
    """

    def __init__(self, bitmask: torch.Tensor, vocab_size: int) -> None:
        if bitmask.device.type != "cpu" or bitmask.dtype != BITMASK_DTYPE or bitmask.dim() != 2:
            raise ValueError("HostRowChecker needs a 2-D int32 bitmask on the host")
        self._words = bitmask.numpy()
        self._num_full_words, tail_bits = divmod(vocab_size, BITS_PER_WORD)
        self._tail_mask = (1 << tail_bits) - 1
        # Pairs of full words scanned as int64: half the elements to count.
        self._num_paired = self._num_full_words - self._num_full_words % 2
        self._heads = [row[: self._num_paired].view(np.int64) for row in self._words]
        # Most rows allow a token among the first ones (single characters, for byte-level
        # vocabularies): a short probe settles them before the full scan.
        # The probe is compared as bytes with zeros: one C comparison, no numpy dispatch.
        probe_bytes = 4 * min(PROBE_WORDS, self._num_paired)
        self._probes = [memoryview(row).cast("B")[:probe_bytes] for row in self._words]
        self._zero_probe = bytes(probe_bytes)
        self.vocab_size, self.row_words = vocab_size, self._words.shape[1]
        self.flat = self._words.reshape(-1).data
        """The buffer's words, one index per word: a Python int, no numpy."""

    def allows(self, row: int, token: int) -> bool:
        """Whether row ``row`` allows ``token`` (never a token outside the vocabulary)."""
        if not 0 <= token < self.vocab_size:
            return False
        word = self.flat[row * self.row_words + (token >> 5)]
        return bool(word >> (token & 31) & 1)

    def __call__(self, row: int) -> bool:
        """Whether row ``row`` allows at least one token below the vocabulary size."""
        if self._probes[row] != self._zero_probe or _count_nonzero(self._heads[row]):
            return True
        words = self._words[row]
        if self._num_paired < self._num_full_words and words[self._num_paired]:
            return True
        return bool(self._tail_mask and int(words[self._num_full_words]) & self._tail_mask)
