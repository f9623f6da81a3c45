"""What ``guidedec bench quality`` counts per mode and task, and the tables it prints."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from guidedec.bench.quality.modes import MODES
from guidedec.bench.quality.runners import Output
from guidedec.bench.quality.tasks import Task


@dataclass
class Tally:
    """One mode on one task."""

    right: int = 0
    units: int = 0
    right_valid: int = 0  # units right in outputs that are valid: usable as they come
    outputs: int = 0
    found: int = 0
    valid: int = 0
    closed: int = 0
    forced: float = 0.0  # summed over the closed outputs
    tokens: int = 0
    seconds: float = 0.0

    @property
    def accuracy(self) -> float:
        return self.right / self.units if self.units else 0.0


def tally(
    task: Task, outputs: Sequence[Output], seconds: float
) -> tuple[Tally, list[dict[str, Any]]]:
    """Judge every output of ``task``; returns the tally and one detail row per item."""
    t = Tally(seconds=seconds)
    rows = []
    for item, out in zip(task.items, outputs, strict=True):
        verdict = task.judge(out.text, item)
        t.right += verdict.right
        t.units += task.units
        t.outputs += 1
        t.found += verdict.found
        t.valid += verdict.valid
        t.right_valid += verdict.right if verdict.valid else 0
        t.tokens += out.tokens
        if out.forced is not None:
            t.closed += 1
            t.forced += out.forced
        rows.append(
            {
                "id": item.id,
                "text": out.text,
                "finish": out.finish,
                "tokens": out.tokens,
                "forced": out.forced,
                "right": verdict.right,
            }
        )
    return t, rows


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion."""
    if total == 0:
        return (0.0, 1.0)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    # The interval holds p; rounding would lose that at p = 0 or 1, where one end is p itself.
    return (max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))


def task_table(task: Task, tallies: Mapping[str, Tally]) -> str:
    """One task's table: a row per mode."""
    lines = [
        f"#### {task.name} ({len(task.items)} items, {task.unit}; max_tokens {task.max_tokens})",
        "",
        f"| mode | {task.unit} right | 95% interval | answer found | valid | right and valid | "
        "closed (forced share) | tokens per output | seconds |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, t in tallies.items():
        low, high = wilson(t.right, t.units)
        closed = f"{t.closed} ({t.forced / t.closed:.0%})" if t.closed else "0"
        lines.append(
            f"| {mode} | {t.right}/{t.units} ({t.accuracy:.0%}) | {low:.0%} to {high:.0%} | "
            f"{t.found}/{t.outputs} | {t.valid}/{t.outputs} | {t.right_valid}/{t.units} | "
            f"{closed} | "
            f"{t.tokens / max(1, t.outputs):.1f} | {t.seconds:.0f} |"
        )
    return "\n".join(lines)


def overview(tasks: Sequence[Task], results: Mapping[str, Mapping[str, Tally]]) -> str:
    """Accuracy (and valid rate) of every mode on every task."""
    seen = dict.fromkeys(m for task in results.values() for m in task)
    known = list(MODES)
    modes = sorted(seen, key=lambda m: known.index(m) if m in known else len(known))
    lines = [
        "| mode | " + " | ".join(t.name for t in tasks) + " |",
        "|---|" + "---:|" * len(tasks),
    ]
    for mode in modes:
        cells = []
        for task in tasks:
            t = results[task.name].get(mode)
            cells.append("" if t is None else f"{t.accuracy:.0%} ({t.valid}/{t.outputs} valid)")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    described = [f"- `{m}`: {MODES[m].describe}" for m in modes if m in MODES]
    return "\n".join([*lines, "", *described])
