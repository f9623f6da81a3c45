"""``MaskBuffer``: CPU logits masked into a buffer that stays -inf between calls.

Masking a sparse row in place (a structural position, a handful of allowed tokens) writes -inf
over all of its logits: at V = 129,280 that is half a megabyte a row, the largest part of a
guided step's apply inside vLLM. A caller that can take the masked logits in another tensor (a
vLLM logits processor returns them) can keep a buffer of -inf and write only a sparse row's
allowed logits into it. Each call first puts -inf back where the last one wrote: the entries of
its sparse rows, and the rows it wrote whole, when they are sparse now.

Rows that are not sparse are written whole: copied, then masked as in place (a blended row is
written from the logits in its one pass). A copy costs about two -inf fills of a row (54 and
30 µs measured at V = 129,280), so a call masks in place instead, and returns ``logits``, when
the sparse rows it would not fill do not outweigh the copies (see :data:`COPY_COST`).

The buffer belongs to the caller until the next call: operations on the returned tensor
(temperature, penalties, top-k and top-p) keep -inf entries -inf, and the next call rewrites
every entry they may have changed. Something that writes a finite value into a masked entry of
the returned tensor (no vLLM sampler step does) would leave it there for later calls: such a
caller masks in place.
"""

from __future__ import annotations

import numpy as np
import torch

from guidedec.bitmask.apply import check_inputs
from guidedec.bitmask.kernels._cpu import PlannedMask, active_rows
from guidedec.bitmask.kernels.common import NEG_INF_BITS, bit_positions, int_view

COPY_COST = 2
"""What copying a row costs, in -inf fills of a row (see the module docs)."""


class MaskBuffer:
    """Applies bitmasks to CPU logits, into a buffer of its own where that writes less."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._scattered: tuple[np.ndarray, np.ndarray] | None = None  # entries written sparse
        self._whole: set[int] = set()  # rows written whole (not -inf where masked)
        self.buffered_calls = 0  # calls that returned the buffer
        self.inplace_calls = 0  # calls that masked ``logits`` in place

    def apply(
        self, logits: torch.Tensor, bitmask: torch.Tensor, token_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The masked logits, with the semantics of :func:`guidedec.bitmask.apply_bitmask`: the
        buffer (a view of ``logits``' shape; ``logits`` is left as it was), or ``logits`` itself
        masked in place. Either way it is bit for bit what ``apply_bitmask`` leaves in
        ``logits``, and valid until the next call.

        Args:
            logits: ``[B, V]`` float CPU tensor, any strides.
            bitmask: ``[B, W]`` int32 CPU tensor.
            token_mask: optional ``[B]`` int32 or bool; rows whose entry is 0 are not masked.

        Raises:
            ValueError: as ``apply_bitmask`` does, or for tensors not on the CPU.
        """
        check_inputs(logits, bitmask, token_mask, None)
        if logits.dim() != 2 or logits.device.type != "cpu":
            raise ValueError("MaskBuffer takes 2-D logits on the CPU")
        num_rows = logits.shape[0]
        active = active_rows(token_mask, num_rows)
        if num_rows == 0 or not active.any():
            return logits
        planned = PlannedMask.of(logits, bitmask, active)
        sparse = planned.plan.restore
        whole = ~sparse
        copied = whole & ~planned.plan.blend
        buffer = self._buffer
        fits = (
            buffer is not None
            and buffer.dtype == logits.dtype
            and buffer.shape[1] == logits.shape[1]
            and buffer.shape[0] >= num_rows
        )
        refills = sum(1 for row in self._whole if row < num_rows and sparse[row]) if fits else 0
        if int(sparse.sum()) - refills <= COPY_COST * int(copied.sum()):
            self.inplace_calls += 1
            planned.apply_inplace(logits, active, bitmask=bitmask)
            return logits
        if not fits:
            buffer = self._allocate(logits)
        assert buffer is not None
        self.buffered_calls += 1
        out = buffer[:num_rows]
        self._put_back(sparse, num_rows)
        int_out = int_view(out)[0].numpy()
        int_in = int_view(logits)[0].numpy()
        rows, columns = bit_positions(
            planned.words, sparse, allowed=True, num_columns=planned.num_columns
        )
        int_out[rows, columns] = int_in[rows, columns]
        self._scattered = (rows, columns)
        for row in np.flatnonzero(copied).tolist():
            np.copyto(int_out[row], int_in[row])
        planned.apply_inplace(out, active & whole, bitmask=bitmask, source=int_in)
        self._whole.update(np.flatnonzero(whole).tolist())
        return out

    def _allocate(self, logits: torch.Tensor) -> torch.Tensor:
        self._buffer = torch.full(logits.shape, float("-inf"), dtype=logits.dtype)
        self._scattered, self._whole = None, set()
        return self._buffer

    def _put_back(self, sparse: np.ndarray, num_rows: int) -> None:
        """-inf where the last call wrote, in the rows that are sparse now (the others are
        written whole)."""
        assert self._buffer is not None
        int_buffer = int_view(self._buffer)[0].numpy()
        neg_inf = NEG_INF_BITS[self._buffer.dtype]
        if self._scattered is not None:
            int_buffer[self._scattered] = neg_inf
            self._scattered = None
        for row in [row for row in self._whole if row < num_rows and sparse[row]]:
            int_buffer[row].fill(neg_inf)
            self._whole.discard(row)
