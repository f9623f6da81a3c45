"""The allowed tokens of sparse rows, as token ids: for a consumer that reads only those.

A structural grammar position allows a handful of tokens out of the whole vocabulary. Masking
such a row writes -inf over the full row and sampling it then reads the full row again, twice
(softmax and the cumulative sum), to find mass in a few columns. A sampler given the allowed ids
gathers those logits and works on them alone: the same distribution (forbidden tokens have
probability 0 either way), in work proportional to the allowed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from guidedec.bitmask.kernels.common import bit_positions, count_allowed_bits, covered_words
from guidedec.bitmask.layout import BITMASK_DTYPE


def sparse_allowed_tokens(
    bitmask: torch.Tensor, rows: Sequence[int], vocab_size: int, max_allowed: int
) -> dict[int, torch.Tensor]:
    """For each of ``rows`` of the host ``bitmask`` that allows at most ``max_allowed`` tokens
    below ``vocab_size``, its allowed token ids (int64, ascending), by row.

    Rows allowing more tokens, or none, are left out.
    """
    if bitmask.device.type != "cpu" or bitmask.dtype != BITMASK_DTYPE or bitmask.dim() != 2:
        raise ValueError("sparse_allowed_tokens needs a 2-D int32 bitmask on the host")
    if not rows:
        return {}
    selected = np.asarray(rows, dtype=np.int64)
    words = covered_words(bitmask[selected], vocab_size)
    counts = count_allowed_bits(words, vocab_size)
    sparse = (counts > 0) & (counts <= max_allowed)
    if not sparse.any():
        return {}
    _, columns = bit_positions(words, sparse, allowed=True, num_columns=vocab_size)
    ids = torch.from_numpy(columns)
    bounds = np.cumsum(counts[sparse]).tolist()
    starts = [0, *bounds[:-1]]
    chosen = selected[sparse].tolist()
    return {row: ids[start:end] for row, start, end in zip(chosen, starts, bounds, strict=True)}
