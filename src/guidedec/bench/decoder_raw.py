"""The baseline of ``guidedec bench decoder``: the raw backend calls (accept, fill, rollback)
as plain functions of the backend matcher objects, with no guidedec code between."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llguidance
import torch
import xgrammar

from guidedec.bench.decoder_results import Times


@dataclass(frozen=True)
class RawOps:
    """The raw backend calls, as plain functions of the backend matcher object."""

    accept: Callable[[Any, int], bool]
    fill: Callable[[Any, torch.Tensor, int], object]
    rollback: Callable[[Any, int], object]


def fill_llguidance_row(matcher: Any, bitmask: torch.Tensor, row: int) -> None:
    """The native call under ``llguidance.torch.fill_next_token_bitmask``, without its per-call
    Python checks: the cheapest way to fill a row, so the baseline is the strictest one."""
    row_bytes = bitmask.shape[1] * 4
    matcher.unsafe_compute_mask_ptr(bitmask.data_ptr() + row * row_bytes, row_bytes)


RAW_OPS = {
    "xgrammar": RawOps(
        xgrammar.GrammarMatcher.accept_token,
        xgrammar.GrammarMatcher.fill_next_token_bitmask,
        xgrammar.GrammarMatcher.rollback,
    ),
    "llguidance": RawOps(
        llguidance.LLMatcher.consume_token,
        lambda matcher, bitmask, row: fill_llguidance_row(matcher, bitmask, row),
        llguidance.LLMatcher.rollback,
    ),
}


def raw_step(
    ops: RawOps,
    matchers: list[Any],
    windows: list[list[int]],
    bitmask: torch.Tensor,
    rollback: int,
    times: Times,
) -> None:
    """Per request: accept the new token and each draft, filling the row after each."""
    start = time.perf_counter()
    row = 0
    for matcher, window in zip(matchers, windows, strict=True):
        for token in window:
            if not ops.accept(matcher, token):
                raise AssertionError(f"the backend rejected token {token}")
            ops.fill(matcher, bitmask, row)
            row += 1
    filled = time.perf_counter()
    if rollback:
        for matcher in matchers:
            ops.rollback(matcher, rollback)
    times.rollback += time.perf_counter() - filled
    times.fill += filled - start
