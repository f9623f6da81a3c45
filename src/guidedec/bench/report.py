"""Summaries, the Markdown table and the plots of ``guidedec bench compliance``."""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from guidedec.bench.compliance_evaluator import BACKENDS
from guidedec.bench.compliance_pool import Times
from guidedec.bench.compliance_worker import ALL, Task


def quantiles(values: Sequence[float] | np.ndarray[Any, Any]) -> dict[str, float | int | None]:
    """Count, mean, p50 and p99 of ``values`` (None when empty)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p99": None}
    p50, p99 = np.percentile(data, [50, 99])
    return {"n": int(data.size), "mean": float(data.mean()), "p50": float(p50), "p99": float(p99)}


def mask_times(tasks: Iterable[Task], name: str, times: Times) -> np.ndarray[Any, Any]:
    """Every mask fill time (us) of backend ``name`` over ``tasks``."""
    arrays: list[array[float]] = [
        times[(t.subset, t.index)][name]
        for t in tasks
        if name in times.get((t.subset, t.index), {})
    ]
    if not arrays:
        return np.zeros(0)
    return np.concatenate([np.frombuffer(a, dtype=np.float32) for a in arrays]).astype(np.float64)


def summarise(tasks: Sequence[Task], backends: Sequence[str], times: Times) -> dict[str, Any]:
    """Per backend: counts, coverage, compliance, compile and mask times over ``tasks``."""
    summary: dict[str, Any] = {}
    for name in backends:
        done = [t.done[name] for t in tasks]
        compiled = [d for d in done if d["compiled"]]
        terminated = sum(d["gen_terminated"] - d["gen_unchecked"] for d in done)
        valid = sum(d["gen_valid"] for d in done)
        summary[name] = {
            "schemas": len(done),
            "compiled": len(compiled),
            "covered": sum(bool(d["covered"]) for d in done),
            "coverage_pct": 100.0 * sum(bool(d["covered"]) for d in done) / max(1, len(done)),
            "false_negatives": sum(d["false_negatives"] for d in done),
            "false_positives": sum(d["false_positives"] for d in done),
            "crashes": sum(d.get("killed") == "crash" for d in done),
            "hangs": sum(d.get("killed") == "hang" for d in done),
            "gen_outputs": sum(d["gen_outputs"] for d in done),
            "gen_terminated": terminated,
            "gen_valid": valid,
            "compliance_pct": 100.0 * valid / terminated if terminated else None,
            **_check_counts(done),
            **_model_counts(done),
            "compile_s": quantiles(
                [d["compile_s"] for d in compiled if d["compile_s"] is not None]
            ),
            "mask_us": quantiles(mask_times(tasks, name, times)),
        }
    if all(name in backends for name in ALL):
        summary["auto_vs_better"] = auto_vs_better(tasks)
    return summary


def _check_counts(done: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the engine's checks did in generation: outputs they ended, tokens steering drew
    again, rows closing forced; and the host time per token with and without them."""
    tokens = sum(d.get("gen_tokens", 0) for d in done)
    plain_tokens = sum(d.get("gen_plain_tokens", 0) for d in done)
    gen_s = sum(d.get("gen_s", 0.0) for d in done)
    plain_s = sum(d.get("gen_plain_s", 0.0) for d in done)
    per_token = gen_s / tokens if tokens else None
    plain_per_token = plain_s / plain_tokens if plain_tokens else None
    return {
        "gen_plain_invalid": sum(d.get("gen_plain_invalid", 0) for d in done),
        "gen_caught": sum(d.get("gen_caught", 0) for d in done),
        "gen_steered": sum(d.get("gen_steered", 0) for d in done),
        "gen_forced": sum(d.get("gen_forced", 0) for d in done),
        "gen_tokens": tokens,
        "gen_us_per_token": None if per_token is None else 1e6 * per_token,
        "gen_plain_us_per_token": None if plain_per_token is None else 1e6 * plain_per_token,
    }


def checks_table(summaries: dict[str, dict[str, Any]]) -> str:
    """The engine's checks in generation, per subset and backend."""
    rows = []
    for subset, per_backend in summaries.items():
        for name in (n for n in ALL if n in per_backend):
            s = per_backend[name]
            if not s["gen_outputs"]:
                continue
            plain, checked = s["gen_plain_us_per_token"], s["gen_us_per_token"]
            ratio = "-" if not plain or checked is None else f"{checked / plain:.2f}"
            cells = [
                subset,
                name,
                s["gen_plain_invalid"],
                s["gen_terminated"] - s["gen_valid"],
                s["gen_caught"],
                s["gen_steered"],
                s["gen_forced"],
                f"{_num(plain, '.0f')} / {_num(checked, '.0f')} ({ratio}x)",
            ]
            rows.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    if not rows:
        return ""
    header = (
        "| subset | backend | stopped invalid, backend alone | stopped invalid, defaults "
        "| ended by the checks | steered tokens | forced rows | host us per token, alone / "
        "defaults |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|"
    )
    return (
        "\n".join([header, *rows])
        + "\n\nGeneration runs twice per schema: with the backend alone, and with the engine's "
        "defaults (budget-aware closing, the root types on xgrammar's first rows, steering, and "
        "the final schema check, which ends an output that breaks its schema with an error "
        "instead of letting it stop). Host time per "
        "generated token: masks, sampling and the checks.\n"
    )


def _model_counts(done: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The reference engine's outputs (``--model``): counts and compliance."""
    outputs = sum(d.get("model_outputs", 0) for d in done)
    terminated = sum(d.get("model_terminated", 0) - d.get("model_unchecked", 0) for d in done)
    valid = sum(d.get("model_valid", 0) for d in done)
    return {
        "model_outputs": outputs,
        "model_terminated": terminated,
        "model_valid": valid,
        "model_compliance_pct": 100.0 * valid / terminated if terminated else None,
    }


def model_table(summaries: dict[str, dict[str, Any]]) -> str:
    """The reference engine's outputs per subset and backend (only when there are any)."""
    rows = [
        f"| {subset} | {name} | {s[name]['model_outputs']} | {s[name]['model_terminated']} "
        f"| {s[name]['model_valid']} | {_num(s[name]['model_compliance_pct'], '.1f')} |"
        for subset, s in summaries.items()
        for name in ALL
        if name in s and s[name]["model_outputs"]
    ]
    if not rows:
        return ""
    header = (
        "| subset | backend | engine outputs | stopped | valid | compliance % |\n"
        "|---|---|---:|---:|---:|---:|"
    )
    return (
        "\n".join([header, *rows])
        + "\n\nThe reference engine with --model (a greedy and a sampled output per schema).\n"
    )


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


TABLE_HEADER = (
    "| subset | backend | schemas | compiled | coverage % | FN | FP | crash/hang | compliance % "
    "| compile ms p50 / p99 | mask us mean / p50 / p99 |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)

NOTES = (
    "coverage: compiled within the timeout, every valid instance accepted token by token under "
    "its masks (FN: not) and every invalid one rejected (FP: accepted), over all schemas. "
    "compliance: random-logits outputs that terminated and validate with jsonschema "
    "(valid / terminated). Compile times over compiled schemas; mask times per "
    "`fill_next_token_bitmask`, over every fill (instances and generation)."
)


def table_rows(subset: str, summary: dict[str, Any]) -> list[str]:
    rows = []
    for name in (n for n in ALL if n in summary):
        s = summary[name]
        c, m = s["compile_s"], s["mask_us"]
        compile_ms = "-" if c["p50"] is None else f"{1000 * c['p50']:.1f} / {1000 * c['p99']:.1f}"
        mask = "-" if m["mean"] is None else f"{m['mean']:.0f} / {m['p50']:.0f} / {m['p99']:.0f}"
        compliance = _num(s["compliance_pct"], ".1f")
        if s["gen_terminated"]:
            compliance += f" ({s['gen_valid']}/{s['gen_terminated']})"
        cells = [
            subset,
            name,
            s["schemas"],
            s["compiled"],
            f"{s['coverage_pct']:.1f}",
            s["false_negatives"],
            s["false_positives"],
            f"{s['crashes']}/{s['hangs']}",
            compliance,
            compile_ms,
            mask,
        ]
        rows.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return rows


def markdown(summaries: dict[str, dict[str, Any]]) -> str:
    rows = [row for subset, s in summaries.items() for row in table_rows(subset, s)]
    text = "\n".join([TABLE_HEADER, *rows]) + "\n\n" + NOTES + "\n"
    versus = [
        s["auto_vs_better"] | {"subset": k} for k, s in summaries.items() if "auto_vs_better" in s
    ]
    if versus:
        text += "\n" + auto_table(versus)
    checks = checks_table(summaries)
    if checks:
        text += "\n" + checks
    engine = model_table(summaries)
    if engine:
        text += "\n" + engine
    return text


def auto_vs_better(tasks: Sequence[Task]) -> dict[str, Any]:
    """``auto`` against the per-schema better of the two backends (a schema either covers)."""
    better = [t for t in tasks if any(t.done[b]["covered"] for b in BACKENDS)]
    below = [t for t in better if not t.done["auto"]["covered"]]
    better_ids = {id(t) for t in better}
    above = [t for t in tasks if t.done["auto"]["covered"] and id(t) not in better_ids]
    return {
        "schemas": len(tasks),
        "xgrammar": sum(bool(t.done["xgrammar"]["covered"]) for t in tasks),
        "llguidance": sum(bool(t.done["llguidance"]["covered"]) for t in tasks),
        "better_of_two": len(better),
        "auto": sum(bool(t.done["auto"]["covered"]) for t in tasks),
        "auto_below_better": [t.name for t in below],
        "auto_above_better": [t.name for t in above],
    }


def auto_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| subset | schemas | xgrammar covered | llguidance covered | better of two | auto covered "
        "| auto misses (better covers) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        misses = ", ".join(r["auto_below_better"][:5]) or "none"
        if len(r["auto_below_better"]) > 5:
            misses += f", ... ({len(r['auto_below_better'])})"
        cells = [r["subset"], r["schemas"], r["xgrammar"], r["llguidance"], r["better_of_two"]]
        lines.append("| " + " | ".join(str(c) for c in [*cells, r["auto"], misses]) + " |")
    note = (
        "better of two: schemas that at least one backend covers. auto misses: schemas one of "
        "them covers and auto does not."
    )
    return "\n".join(lines) + "\n\n" + note + "\n"


def cause(result: dict[str, Any]) -> str | None:
    """Why a backend does not cover a schema (None when it does): its compile error, or its
    first false negative or positive."""
    if result["covered"]:
        return None
    if not result["compiled"]:
        return f"compile: {result['error']}"
    kind = "FN" if result["false_negatives"] else "FP"
    first = result["instance_errors"][0] if result["instance_errors"] else "?"
    return f"{kind} ({result['false_negatives']} FN, {result['false_positives']} FP): {first}"


def cause_group(text: str) -> str:
    """``text`` with its particulars (quoted names, numbers, token ids) blanked, to group
    causes of one kind."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "…", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text.split(":  ")[0][:110]


def misses_markdown(tasks: Sequence[Task], backends: Sequence[str]) -> str:
    """Every schema a backend does not cover and every non-compliant output, with the cause,
    grouped by kind, then listed one by one. For ``auto`` the cause starts with the backend it
    was on and why (the other one's refusal when it fell back)."""
    parts = ["# What the backends miss, and why", ""]
    for name in backends:
        causes = [(t, c) for t in tasks if (c := cause(t.done[name])) is not None]
        invalid = [t for t in tasks if _invalid_outputs(t.done[name])]
        title = f"## {name}: {len(causes)} not covered, {len(invalid)} with invalid outputs"
        parts += [title, ""]
        groups = Counter(
            f"{auto_context(t.done)}: {cause_group(c)}" if name == "auto" else cause_group(c)
            for t, c in causes
        )
        groups.update(f"{auto_context(t.done)}: invalid outputs" for t in invalid if name == "auto")
        if groups:
            parts += ["| count | cause (particulars blanked) |", "|---:|---|"]
            parts += [f"| {n} | {g.replace('|', '/')} |" for g, n in groups.most_common()]
            parts.append("")
        for t, c in causes:
            via = f" [{auto_context(t.done)}]" if name == "auto" else ""
            parts.append(f"- {t.subset} `{t.name}`{via}: {c}")
        for t in invalid:
            result = t.done[name]
            count = _invalid_outputs(result)
            errors = [e for e in result["gen_errors"] if not e.startswith("unchecked")]
            first = errors[0] if errors else "?"
            via = f" [{auto_context(t.done)}]" if name == "auto" else ""
            parts.append(f"- {t.subset} `{t.name}`{via}: {count} non-compliant output(s): {first}")
        parts.append("")
    return "\n".join(parts)


def auto_context(done: dict[str, dict[str, Any]]) -> str:
    """The backend ``auto`` was on for a schema, and why when it is not its first choice."""
    auto = done["auto"]
    chosen, order = auto.get("chosen"), auto.get("order") or []
    if not chosen:
        return "no backend"
    if order and chosen != order[0]:
        refused = done.get(order[0], {}).get("error") or "refused"
        refused = refused.split(": ", 1)[-1][:90]
        return f"on {chosen}, {order[0]} refused ({refused})"
    return f"on {chosen}"


def _invalid_outputs(result: dict[str, Any]) -> int:
    return int(result["gen_terminated"] - result["gen_unchecked"] - result["gen_valid"])


def plot(
    out: Path,
    summaries: dict[str, dict[str, Any]],
    samples: dict[str, np.ndarray[Any, Any]],
) -> list[Path]:
    """``coverage.png`` (grouped bars: subset x backend) and ``mask_times.png`` (histograms of
    mask fill times per backend, log scale). Returns the files written."""
    from matplotlib.figure import Figure

    subsets = list(summaries)
    backends = list(samples)
    fig = Figure(figsize=(max(6.0, 1.2 * len(subsets) * len(backends) / 2 + 2), 4.5))
    ax = fig.subplots()
    width = 0.8 / max(1, len(backends))
    positions = np.arange(len(subsets))
    for k, name in enumerate(backends):
        values = [summaries[s][name]["coverage_pct"] for s in subsets]
        bars = ax.bar(positions + k * width, values, width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(positions + width * (len(backends) - 1) / 2, subsets, rotation=20)
    ax.set_ylabel("coverage %")
    ax.set_ylim(0, 120)
    ax.set_title("Schemas covered (compiled, no FN, no FP)")
    ax.legend(loc="upper right", ncol=len(backends))
    fig.tight_layout()
    coverage = out / "coverage.png"
    fig.savefig(coverage, dpi=110)

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    positive = [v[v > 0] for v in samples.values() if (v > 0).any()]
    if positive:
        low = max(0.1, min(float(v.min()) for v in positive))
        high = max(float(v.max()) for v in positive)
        bins = np.geomspace(low, max(high, low * 10), 60)
        for name, sample in samples.items():
            if sample.size:
                ax.hist(
                    sample, bins=bins.tolist(), histtype="step", label=f"{name} ({sample.size})"
                )
        ax.set_xscale("log")
        ax.legend()
    ax.set_xlabel("mask fill time (us)")
    ax.set_ylabel("fills")
    ax.set_title("Mask time distribution (all subsets)")
    fig.tight_layout()
    masks = out / "mask_times.png"
    fig.savefig(masks, dpi=110)
    return [coverage, masks]
