"""The figures and files every benchmark writes under ``--out``: a Markdown summary and PNG bar
charts (matplotlib's object API, no display needed)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from guidedec.bench.environment import environment


def grouped_bars(
    path: Path,
    *,
    title: str,
    ylabel: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    log: bool = False,
    label_format: str = "%.3g",
    reference: float | None = None,
) -> Path:
    """One bar per series in each group (missing values are left out); ``reference`` draws a
    dashed horizontal line (a target or a baseline). Writes ``path`` and returns it."""
    from matplotlib.figure import Figure

    width = 0.8 / max(1, len(series))
    fig = Figure(figsize=(max(6.0, 0.5 * len(groups) * len(series) + 2), 4.5))
    ax = fig.subplots()
    positions = np.arange(len(groups))
    for k, (name, values) in enumerate(series.items()):
        heights = [np.nan if v is None else float(v) for v in values]
        bars = ax.bar(positions + k * width, heights, width, label=name)
        ax.bar_label(bars, fmt=label_format, fontsize=7)
    if reference is not None:
        ax.axhline(reference, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(positions + width * (len(series) - 1) / 2, list(groups))
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def write_report(out: Path, name: str, report: dict[str, Any]) -> Path:
    """``out/name.json``: a benchmark's measurements and the environment they ran in."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return path


def write_scores(
    out: Path, name: str, tallies: Mapping[str, Any], outputs: Mapping[str, Any], text: str
) -> None:
    """An answer-quality benchmark's ``out/name.json`` (each mode's tally, its outputs and the
    environment) and ``out/summary.md`` (``text``)."""
    report = {
        "argv": sys.argv[1:],
        **environment(),
        "results": {mode: vars(t) for mode, t in tallies.items()},
        "outputs": dict(outputs),
    }
    write_report(out, name, report)
    write_summary(out, text)


def write_summary(out: Path, text: str) -> Path:
    """``out/summary.md``: the tables a benchmark printed (what the README quotes)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.md"
    path.write_text(text.rstrip() + "\n", encoding="utf-8")
    return path
