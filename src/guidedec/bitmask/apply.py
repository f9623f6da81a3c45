"""``apply_bitmask``: mask the logits of every token the grammar forbids, in place."""

from __future__ import annotations

from typing import Literal

import torch

from guidedec.bitmask.kernels import KernelName, load_kernel, resolve_backend
from guidedec.bitmask.layout import BITMASK_DTYPE

Backend = Literal["auto"] | KernelName
LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
TOKEN_MASK_DTYPES = (torch.int32, torch.bool)


def apply_bitmask(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    token_mask: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> None:
    """Set to -inf, in place, every logit whose token the bitmask does not allow.

    Args:
        logits: ``[B, V_logits]`` float32, float16, bfloat16 or float64, any strides (a column
            slice or every other row of a larger tensor is fine); a 1-D tensor is one row.
            Modified in place.
        bitmask: ``[B, W]`` int32 (``[W]`` or ``[1, W]`` for 1-D logits); row ``i`` applies to
            logits row ``i``. Token ``t`` is allowed iff bit ``t % 32`` (least significant bit
            first) of word ``t // 32`` is 1.
        token_mask: optional ``[B]`` int32 or bool; a row whose entry is 0 (False) is not touched
            at all.
        d2t: optional ``[V_logits]`` integer tensor of draft-to-target offsets (an EAGLE-3
            pruned draft vocabulary): logits column ``i`` is target token ``i + d2t[i]``.
            Without it column ``i`` is token ``i``.
        backend: ``"torch"`` (pure-torch reference: unpack every bit, ``masked_fill_``),
            ``"cpu"`` (fast CPU kernel, work proportional to the minority side of each row),
            ``"triton"`` (Triton kernel for CUDA tensors, needs the ``triton`` package; it takes
            CPU tensors only under ``TRITON_INTERPRET=1``, through Triton's slow interpreter, for
            testing), or ``"auto"`` (``"cpu"`` for CPU tensors, ``"triton"`` for CUDA tensors,
            ``"torch"`` otherwise).

    Semantics, for each row ``i`` with ``token_mask[i] != 0`` (every row without a token mask)
    and each column ``j``, with target ``t = j`` (``t = j + d2t[j]`` with ``d2t``):
    ``logits[i, j]`` becomes exactly -inf in the logits dtype unless ``0 <= t < 32 * W`` and bit
    ``t`` of ``bitmask[i]`` is 1. So columns not covered by the bitmask are masked, and bits past
    ``V_logits`` are ignored. Allowed entries are left untouched bit for bit (NaN included).

    Raises:
        ValueError: for an unknown backend (the message lists the valid choices), a backend that
            does not run on the tensors' device, a wrong dtype, rank or shape, a row-count
            mismatch, or tensors on different devices.
    """
    kernel = load_kernel(resolve_backend(backend, logits.device))
    rows, words = check_inputs(logits, bitmask, token_mask, d2t)
    if rows.numel() == 0:
        return
    kernel(rows, words, token_mask, d2t)


def check_inputs(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    token_mask: torch.Tensor | None,
    d2t: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raise ``ValueError`` for inputs :func:`apply_bitmask` refuses; else the 2-D views
    ``[B, V_logits]`` and ``[B, W]``."""
    rows, words = _as_rows(logits, bitmask)
    _check_token_mask(token_mask, rows.shape[0])
    check_d2t(d2t, rows.shape[1])
    _check_devices(logits, bitmask, token_mask, d2t)
    return rows, words


def _as_rows(logits: torch.Tensor, bitmask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate and return 2-D views ``[B, V_logits]`` and ``[B, W]``."""
    if logits.dtype not in LOGITS_DTYPES:
        raise ValueError(
            f"logits must be float32, float16, bfloat16 or float64, got {logits.dtype}"
        )
    if logits.dim() not in (1, 2):
        raise ValueError(f"logits must be 1-D or 2-D, got shape {tuple(logits.shape)}")
    if bitmask.dtype != BITMASK_DTYPE:
        raise ValueError(f"bitmask must be {BITMASK_DTYPE}, got {bitmask.dtype}")
    if bitmask.dim() not in (1, 2) or (bitmask.dim() == 1 and logits.dim() == 2):
        raise ValueError(
            f"bitmask must be [B, W] (or [W] for 1-D logits), got shape {tuple(bitmask.shape)}"
        )
    rows = logits.unsqueeze(0) if logits.dim() == 1 else logits
    words = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
    if words.shape[0] != rows.shape[0]:
        raise ValueError(
            f"bitmask has {words.shape[0]} rows but logits have {rows.shape[0]}; "
            "row i of the bitmask applies to row i of the logits"
        )
    if words.shape[1] == 0:
        raise ValueError("bitmask rows must have at least one word")
    return rows, words


def _check_token_mask(token_mask: torch.Tensor | None, num_rows: int) -> None:
    if token_mask is None:
        return
    if token_mask.dtype not in TOKEN_MASK_DTYPES:
        raise ValueError(f"token_mask must be int32 or bool, got {token_mask.dtype}")
    if tuple(token_mask.shape) != (num_rows,):
        raise ValueError(f"token_mask must have shape ({num_rows},), got {tuple(token_mask.shape)}")


def check_d2t(d2t: torch.Tensor | None, num_columns: int | None = None) -> None:
    """Raise ``ValueError`` unless ``d2t`` is None or an integer tensor (of shape
    ``(num_columns,)`` when given)."""
    if d2t is None:
        return
    if d2t.dtype.is_floating_point or d2t.dtype.is_complex or d2t.dtype == torch.bool:
        raise ValueError(f"d2t must be an integer tensor, got {d2t.dtype}")
    if num_columns is not None and tuple(d2t.shape) != (num_columns,):
        raise ValueError(f"d2t must have shape ({num_columns},), got {tuple(d2t.shape)}")


def _check_devices(logits: torch.Tensor, *others: torch.Tensor | None) -> None:
    for other in others:
        if other is not None and other.device != logits.device:
            raise ValueError(
                f"all tensors must be on the logits device {logits.device}, got {other.device}"
            )
