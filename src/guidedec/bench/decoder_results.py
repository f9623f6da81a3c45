"""The results of ``guidedec bench decoder``: paired ratios of the decoder's step against the
raw backend calls, their medians and the markdown table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

TARGET_OVERHEAD_PCT = 10.0


@dataclass
class Times:
    """Seconds summed over the steps of one run, per phase."""

    add: float = 0.0
    fill: float = 0.0
    rollback: float = 0.0


@dataclass
class Samples:
    """Per-step milliseconds of each repeat, per path and phase."""

    decoder: dict[str, list[float]] = field(default_factory=dict)
    raw: dict[str, list[float]] = field(default_factory=dict)


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over repeats of num / den (each repeat's two runs were adjacent in time)."""
    return statistics.median(n / d for n, d in zip(num, den, strict=True) if d > 0)


def summarize(setting: dict[str, Any], samples: Samples) -> dict[str, Any]:
    """One row of the results: ``setting``'s fields (backend, batch, drafts, ...), the median
    milliseconds of each phase and the paired ratios against the raw backend calls."""
    dec, raw = samples.decoder, samples.raw
    ratio = paired_ratio(dec["total"], raw["total"])
    dec_all = [t + a for t, a in zip(dec["total"], dec["add"], strict=True)]
    return {
        **setting,
        "median_ms_per_step": medians(samples),
        "ratio_build_vs_accept_fill": paired_ratio(dec["fill"], raw["fill"]),
        "ratio_rollback": paired_ratio(dec["rollback"], raw["rollback"])
        if setting["drafts"]
        else None,
        "ratio_total": ratio,
        "overhead_pct": 100 * (ratio - 1),
        "overhead_pct_with_add_batch": 100 * (paired_ratio(dec_all, raw["total"]) - 1),
        "meets_target": 100 * (ratio - 1) <= TARGET_OVERHEAD_PCT,
    }


def medians(samples: Samples) -> dict[str, float]:
    """Median per-step milliseconds of each phase (total: build or accept + fill, + rollback)."""
    dec, raw = samples.decoder, samples.raw
    return {
        "decoder_add_batch": statistics.median(dec["add"]),
        "decoder_build": statistics.median(dec["fill"]),
        "decoder_rollback": statistics.median(dec["rollback"]),
        "decoder_total": statistics.median(dec["total"]),
        "raw_accept_fill": statistics.median(raw["fill"]),
        "raw_rollback": statistics.median(raw["rollback"]),
        "raw_total": statistics.median(raw["total"]),
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | batch | drafts | rows/step | raw ms/step | decoder ms/step | raw µs/row "
        "| decoder µs/row | build / fill | rollback | overhead | + add_batch | add_batch µs "
        f"| ≤ {TARGET_OVERHEAD_PCT:.0f}% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    lines += [table_line(row) for row in rows]
    return "\n".join(lines)


def table_line(row: dict[str, Any]) -> str:
    ms, rows = row["median_ms_per_step"], row["rows_per_step"]
    rollback = "–" if row["ratio_rollback"] is None else f"{row['ratio_rollback']:.2f}x"
    return (
        f"| {row['backend']} | {row['batch']} | {row['drafts']} | {rows} "
        f"| {ms['raw_total']:.3f} | {ms['decoder_total']:.3f} "
        f"| {1e3 * ms['raw_total'] / rows:.1f} | {1e3 * ms['decoder_total'] / rows:.1f} "
        f"| {row['ratio_build_vs_accept_fill']:.2f}x | {rollback} "
        f"| {row['overhead_pct']:+.1f}% | {row['overhead_pct_with_add_batch']:+.1f}% "
        f"| {1e3 * ms['decoder_add_batch']:.0f} | {'yes' if row['meets_target'] else 'NO'} |"
    )
