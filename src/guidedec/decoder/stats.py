"""The decoder's counters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class DecoderStats:
    """Timings of the last step, in seconds, and running totals."""

    build_s: float = 0.0
    apply_s: float = 0.0
    steps: int = 0
    rows_filled: int = 0
    failures: int = 0
