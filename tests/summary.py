"""The session summary of the data-driven tests: one row per (data set, backend).

``test_soundness.py`` and ``test_instances.py`` attach their counts to their test report with
:func:`record` (user properties travel back from pytest-xdist workers); ``conftest.py`` prints
the merged rows at the end of the session with :func:`write_table`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

PROPERTY = "guidedec_summary"
# (title, count key, total key or None): generation ("gen_") and instance ("inst_") counts.
COLUMNS = (
    ("compiled", "gen_compiled", "gen_cases"),
    ("terminated", "gen_terminated", "gen_outputs"),
    ("valid", "gen_valid", None),
    ("invalid", "gen_invalid", None),
    ("unchk", "gen_unchecked", None),
    ("allow", "gen_allowed", None),
    ("err", "gen_errors", None),
    ("i.compiled", "inst_compiled", "inst_cases"),
    ("FN", "inst_fn", "inst_valid"),
    ("FP", "inst_fp", "inst_invalid"),
    ("FN.order", "inst_fn_order", None),
    ("FP.format", "inst_fp_format", None),
    ("FN.allow", "inst_fn_allowed", None),
    ("FP.allow", "inst_fp_allowed", None),
)
LEGEND = (
    "compiled: guides the backend compiled; terminated: outputs that sampled a stop token "
    "(of those generated); valid/invalid/unchk(ecked)/allow(ed): their verdicts; err: requests "
    "the decoder failed; FN/FP: valid instances rejected / invalid ones accepted; .order: keys "
    "out of schema order; .format: labelled invalid only by a format; .allow: documented limits"
)


def record(
    request: pytest.FixtureRequest,
    dataset: str,
    backend: str,
    prefix: str,
    counts: Mapping[str, int],
    *,
    stale_limits: Sequence[str] = (),
) -> None:
    """Attach one test's counts (keys prefixed ``gen_`` or ``inst_``) to its report."""
    row: dict[str, Any] = {"dataset": dataset, "backend": backend}
    row |= {f"{prefix}_{key}": value for key, value in counts.items()}
    if stale_limits:
        row["stale_limits"] = list(stale_limits)
    request.node.user_properties.append((PROPERTY, row))


def write_table(terminalreporter: pytest.TerminalReporter) -> None:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == PROPERTY:
                    rows.setdefault((value["dataset"], value["backend"]), {}).update(value)
    if rows:
        terminalreporter.write_sep("=", "guided generation and instances on public data")
        for line in table_lines(rows):
            terminalreporter.write_line(line)


def table_lines(rows: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The table: a cell ``n/m`` is a count out of a total; ``-`` where that test did not run."""
    header = ["data set", "backend", *(title for title, _, _ in COLUMNS)]
    table = [header]
    for (dataset, backend), row in sorted(rows.items()):
        cells = [dataset, backend]
        for _, key, total in COLUMNS:
            ran = any(k.startswith(key.split("_")[0] + "_") for k in row)
            value = str(row.get(key, 0)) if ran else "-"
            cells.append(f"{value}/{row.get(total, 0)}" if total and ran else value)
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    lines.append(LEGEND)
    stale = [
        f"{dataset}/{backend}: {case_id}"
        for (dataset, backend), row in sorted(rows.items())
        for case_id in row.get("stale_limits", ())
    ]
    if stale:
        lines.append("allow-list entries with no mismatch in this run: " + "; ".join(stale))
    return lines
