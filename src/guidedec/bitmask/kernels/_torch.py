"""Pure-torch reference kernel: unpack every bit, then one ``masked_fill_``.

Simple enough to be obviously right and device-agnostic; the fast kernels are tested against it.
"""

from __future__ import annotations

import torch

from guidedec.bitmask.layout import BITS_PER_WORD


def unpack_bits(bitmask: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` int32 words -> ``[B, 32 * W]`` bool, element ``t`` = bit ``t % 32`` of word
    ``t // 32`` (least significant bit first)."""
    shifts = torch.arange(BITS_PER_WORD, dtype=bitmask.dtype, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(-2).bool()


def allowed_columns(
    bitmask: torch.Tensor, num_columns: int, d2t: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, num_columns]`` bool: whether each logits column is allowed by its bitmask row.

    Column ``i`` stands for target token ``i`` (or ``i + d2t[i]`` with ``d2t``); a target outside
    ``[0, 32 * W)`` is not covered by the bitmask and so is not allowed.
    """
    num_bits = bitmask.shape[1] * BITS_PER_WORD
    if d2t is None:
        bits = unpack_bits(bitmask)[:, :num_columns]
        missing = num_columns - bits.shape[1]
        return torch.nn.functional.pad(bits, (0, missing), value=False) if missing else bits
    columns = torch.arange(num_columns, dtype=torch.int64, device=bitmask.device)
    targets = columns + d2t.to(torch.int64)
    covered = (targets >= 0) & (targets < num_bits)
    safe_targets = torch.where(covered, targets, 0)
    words = bitmask.index_select(1, safe_targets // BITS_PER_WORD)
    bits = (words >> (safe_targets % BITS_PER_WORD).to(bitmask.dtype)) & 1
    return bits.bool() & covered


def apply_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    token_mask: torch.Tensor | None,
    d2t: torch.Tensor | None,
) -> None:
    """Set every logit whose token the bitmask forbids to -inf, in place (see the package docs)."""
    forbidden = ~allowed_columns(bitmask, logits.shape[1], d2t)
    if token_mask is not None:
        forbidden &= (token_mask != 0).unsqueeze(1)
    logits.masked_fill_(forbidden, float("-inf"))
