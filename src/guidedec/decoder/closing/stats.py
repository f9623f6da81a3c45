"""What budget-aware closing did, summed over a decoder's life."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ClosingStats:
    """What closing did, summed over the decoder's life."""

    searches: int = 0
    nodes: int = 0
    search_s: float = 0.0
    forced_rows: int = 0
    no_fit: int = 0
    resampled: int = 0
    recent_hits: int = 0
    respelled: int = 0  # witnesses found by encoding the previous one's text again
    searches_given_up: int = 0  # a guide's masks were too slow to search (SLOW_SEARCH_S)
