"""The decoder's bitmask buffers: host rows the build fills, device rows the apply reads, and the
per-row token mask (1 = apply the row).

The host loop reads and writes through numpy views and a memoryview: torch indexing costs
microseconds per call, which is as much as a backend's mask fill.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

import numpy as np
import torch

from guidedec.bitmask import (
    HostRowChecker,
    allocate_bitmask,
    apply_bitmask_sharded,
    sparse_allowed_tokens,
)
from guidedec.bitmask.layout import token_word
from guidedec.decoder.profiling import nvtx_range
from guidedec.decoder.streams import StepSync


class BitmaskBuffers:
    """``num_rows`` bitmask rows of ``ceil(vocab_size / 32)`` int32 words and their token mask,
    on the host (pinned when ``device`` is a CUDA device) and on ``device``.

    Attributes:
        bitmask_host, token_mask_host: The host buffers the build fills.
        bitmask, token_mask: The device buffers the apply reads (the host ones on the CPU).
        words: ``bitmask_host`` as a numpy array.
        token_mask_np: ``token_mask_host`` as a numpy array; ``token_mask_words`` its memoryview.
        row_is_valid: Whether a host row allows a token (``row_is_valid(row)``).
        sync: The step's stream and event ordering (:class:`StepSync`).
    """

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device, rank: int) -> None:
        on_cuda = device.type == "cuda"
        self.num_rows, self.vocab_size, self.rank = num_rows, vocab_size, rank
        self.bitmask_host = allocate_bitmask(num_rows, vocab_size, pin_memory=on_cuda)
        self.token_mask_host = torch.zeros(num_rows, dtype=torch.int32, pin_memory=on_cuda)
        if on_cuda:
            self.bitmask = torch.empty_like(self.bitmask_host, device=device)
            self.token_mask = torch.empty_like(self.token_mask_host, device=device)
        else:
            self.bitmask, self.token_mask = self.bitmask_host, self.token_mask_host
        self.row_is_valid = HostRowChecker(self.bitmask_host, vocab_size)
        self.words = self.bitmask_host.numpy()
        self.token_mask_np = self.token_mask_host.numpy()
        self.token_mask_words = self.token_mask_np.data
        self._zeros = memoryview(bytes(self.token_mask_words.nbytes)).cast("i")
        self.sync = StepSync(device)

    def clear(self) -> None:
        """Mark every row unmasked (past a batch's rows too: a graph padded past it reads them)."""
        self.token_mask_words[:] = self._zeros

    def force_row(self, row: int, token: int) -> None:
        """Write a row that allows ``token`` only."""
        words = self.words[row]
        words[:] = 0
        words[token >> 5] = token_word(token)
        self.token_mask_words[row] = 1

    def single_token_rows(self, rows: Sequence[int]) -> dict[int, int]:
        """Those of the masked ``rows`` that allow exactly one token, with that token."""
        words = self.words.view(np.uint32)
        single = {}
        for row in rows:
            if self.token_mask_np[row] and int(np.bitwise_count(words[row]).sum()) == 1:
                word = int(np.flatnonzero(words[row])[0])
                single[row] = 32 * word + int(words[row, word]).bit_length() - 1
        return single

    def sparse_rows(
        self, rows: Sequence[int], max_allowed: int, *, take: bool = False
    ) -> dict[int, torch.Tensor]:
        """The allowed token ids (int64, ascending) of those of the masked ``rows`` that allow
        at most ``max_allowed`` tokens, by row; ``take`` unmasks them (the caller owns them)."""
        filled = [row for row in rows if self.token_mask_np[row]]
        found = sparse_allowed_tokens(self.bitmask_host, filled, self.vocab_size, max_allowed)
        if take:
            for row in found:
                self.token_mask_np[row] = 0
        return found

    def copy_rows(self, num_rows: int) -> None:
        """Copy the first ``num_rows`` host rows (and their token mask) to the device."""
        self.sync.note("side: copy bitmask")
        if self.bitmask is self.bitmask_host:
            return
        with nvtx_range("guided_decoder.copy_bitmask"):
            self.bitmask[:num_rows].copy_(self.bitmask_host[:num_rows], non_blocking=True)
            self.token_mask[:num_rows].copy_(self.token_mask_host[:num_rows], non_blocking=True)

    def apply_rows(
        self, logits: torch.Tensor, num_rows: int, *, d2t: torch.Tensor | None = None
    ) -> float:
        """Mask the first ``num_rows`` rows of ``logits`` in place from the device rows (see
        :func:`guidedec.bitmask.apply_bitmask_sharded` for sharded logits and ``d2t``); returns
        the seconds it took."""
        self.sync.note("main: apply bitmask")
        if logits.dim() != 2 or logits.shape[0] < num_rows:
            raise ValueError(
                f"logits must be 2-D with at least {num_rows} rows, got {tuple(logits.shape)}"
            )
        start = perf_counter()
        with nvtx_range("guided_decoder.apply_bitmask"):
            apply_bitmask_sharded(
                logits[:num_rows],
                self.bitmask[:num_rows],
                token_mask=self.token_mask[:num_rows],
                d2t=d2t,
                rank=self.rank,
                vocab_size_padded=self.vocab_size,
            )
        return perf_counter() - start
