"""Token bitmasks: layout, validity check and the kernels that apply them to logits."""

from guidedec.bitmask.apply import apply_bitmask
from guidedec.bitmask.layout import (
    BITMASK_DTYPE,
    HostRowChecker,
    allocate_bitmask,
    bitmask_size,
    row_has_valid_token,
)

__all__ = [
    "BITMASK_DTYPE",
    "HostRowChecker",
    "allocate_bitmask",
    "apply_bitmask",
    "bitmask_size",
    "row_has_valid_token",
]
