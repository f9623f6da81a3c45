"""Measure how well each backend, and ``backend="auto"``, covers JSONSchemaBench.

A schema is *covered* by a backend (MaskBench's "passing") when it compiles within
``--compile-timeout`` seconds, every valid test instance is accepted and every invalid one is
rejected. An instance is checked as ``json.dumps(data)`` with
:func:`guidedec.testing.accepts_output` (default ``json_whitespace="flexible"``).

Every schema runs in one of ``--workers`` forked worker processes (``auto_workers.py``), watched
by the parent: a compile past its deadline, a hang or a crash kills that worker only, is recorded
against the backend that caused it, and the schema goes on in a fresh worker. A valid instance
also counts as rejected when a mask along its tokens fails or forbids the next token (decoding
could not produce it).

Usage::

    HF_HUB_OFFLINE=1 python benchmarks/measure_auto.py --out bench-out/measure_auto
    HF_HUB_OFFLINE=1 python benchmarks/measure_auto.py --subsets JME MCPspec --limit 20

Prints a Markdown table per subset to stdout and writes ``SUBSET.json`` (per-schema records and
the summary) plus ``summary.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from auto_workers import ALL, BACKENDS, Pool, Task, Times
from guidedec import TokenizerInfo
from guidedec.grammar.llguidance_backend import llguidance_tokenizer
from guidedec.grammar.xgrammar_backend import xgrammar_tokenizer_info

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench"

# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def read_subset(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file (split on ``\\n`` only: some lines hold U+2028/U+2029)."""
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def sample_tasks(subset: str, limit: int | None, seed: int) -> list[Task]:
    records = read_subset(DATA_DIR / f"{subset}.jsonl")
    indices = list(range(len(records)))
    if limit is not None and limit < len(records):
        indices = sorted(random.Random(f"{seed}:{subset}").sample(indices, limit))
    return [
        Task(
            subset,
            i,
            str(records[i].get("file", i)),
            json.dumps(records[i]["schema"]),
            records[i]["tests"],
        )
        for i in indices
    ]


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def miss_cause(done: dict[str, dict[str, Any]]) -> str:
    """Why auto failed a schema that a backend covers."""
    auto = done["auto"]
    if not auto["compiled"]:
        return f"auto did not compile: {auto['error']}"
    fn, fp = auto["false_negatives"], auto["false_positives"]
    return f"auto chose {auto['chosen']}: {fn} valid rejected, {fp} invalid accepted"


def mask_stats(times: Sequence[array[float]]) -> dict[str, float | int | None]:
    values = torch.tensor([t for a in times for t in a], dtype=torch.float64)
    if values.numel() == 0:
        return {"tokens": 0, "mean": None, "p50": None, "p99": None}
    quantiles = torch.quantile(values, torch.tensor([0.5, 0.99], dtype=torch.float64))
    return {
        "tokens": int(values.numel()),
        "mean": float(values.mean()),
        "p50": float(quantiles[0]),
        "p99": float(quantiles[1]),
    }


def summarise(tasks: list[Task], times: Times) -> dict[str, Any]:
    """Counts, misses and mask times of one subset."""
    summary: dict[str, Any] = {"schemas": len(tasks)}
    for name in ALL:
        summary[name] = {
            "compiled": sum(t.done[name]["compiled"] for t in tasks),
            "covered": sum(t.done[name]["covered"] for t in tasks),
        }
    better = [t for t in tasks if any(t.done[b]["covered"] for b in BACKENDS)]
    summary["better_of_two"] = len(better)
    summary["auto_chose_xgrammar"] = sum(t.done["auto"]["chosen"] == "xgrammar" for t in tasks)
    summary["auto_misses"] = [
        {"name": t.name, "index": t.index, "cause": miss_cause(t.done)}
        for t in better
        if not t.done["auto"]["covered"]
    ]
    summary["llguidance_wrong_xgrammar_right"] = [
        {"name": t.name, "index": t.index, "llguidance": short(t.done["llguidance"])}
        for t in tasks
        if t.done["llguidance"]["compiled"]
        and not t.done["llguidance"]["covered"]
        and t.done["xgrammar"]["covered"]
    ]
    common = [t for t in tasks if all(t.done[n]["covered"] for n in ALL)]
    summary["mask_us_common_schemas"] = len(common)
    summary["mask_us_common"] = {name: mask_stats(times_of(common, name, times)) for name in ALL}
    summary["mask_us_own"] = {
        name: mask_stats(times_of([t for t in tasks if t.done[name]["covered"]], name, times))
        for name in ALL
    }
    return summary


def times_of(tasks: list[Task], name: str, times: Times) -> list[array[float]]:
    return [times[(t.subset, t.index)][name] for t in tasks]


def short(result: dict[str, Any]) -> str:
    return (
        f"{result['false_negatives']} valid rejected, {result['false_positives']} invalid accepted"
    )


def fmt_us(stats: dict[str, Any]) -> str:
    if stats["mean"] is None:
        return "-"
    return f"{stats['mean']:.0f} / {stats['p50']:.0f} / {stats['p99']:.0f}"


TABLE_HEADER = (
    "| subset | schemas | xgr compiled | xgr covered | llg compiled | llg covered | better of two "
    "| auto covered | auto on xgr | mask us xgr (mean/p50/p99) | llg | auto |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


MASK_NOTE = (
    "Mask times: microseconds per `fill_next_token_bitmask`, before every token of every valid "
    "instance, over the schemas that all three cover (`-`: none); each backend over its own "
    "covered schemas is in the JSON (`mask_us_own`)."
)


def table_row(subset: str, s: dict[str, Any]) -> str:
    m = s["mask_us_common"]
    cells = [
        subset,
        s["schemas"],
        s["xgrammar"]["compiled"],
        s["xgrammar"]["covered"],
        s["llguidance"]["compiled"],
        s["llguidance"]["covered"],
        s["better_of_two"],
        s["auto"]["covered"],
        s["auto_chose_xgrammar"],
        fmt_us(m["xgrammar"]),
        fmt_us(m["llguidance"]),
        fmt_us(m["auto"]),
    ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def misses_markdown(subset: str, s: dict[str, Any]) -> str:
    lines = [f"### {subset}: auto misses ({len(s['auto_misses'])})"]
    lines += [f"- `{m['name']}`: {m['cause']}" for m in s["auto_misses"]]
    wrong = s["llguidance_wrong_xgrammar_right"]
    lines.append(f"\nllguidance compiles but is wrong where xgrammar is right ({len(wrong)}):")
    lines += [f"- `{w['name']}`: {w['llguidance']}" for w in wrong]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

SUBSETS = (
    "Github_trivial",
    "Github_easy",
    "Glaiveai2K",
    "Handwritten",
    "JME",
    "Kubernetes",
    "MCPspec",
    "Synthesized",
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subsets", nargs="+", default=list(SUBSETS), choices=SUBSETS)
    parser.add_argument(
        "--limit",
        nargs="+",
        default=[],
        help="schemas per subset, sampled: N for every subset and/or SUBSET=N for one",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-out/measure_auto"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compile-timeout", type=float, default=10.0)
    parser.add_argument("--task-timeout", type=float, default=120.0, help="instance checks, s")
    return parser.parse_args(argv)


def subset_limit(limits: Sequence[str], subset: str) -> int | None:
    """The ``--limit`` that applies to ``subset`` (``SUBSET=N`` wins over a bare ``N``)."""
    chosen: int | None = None
    for item in limits:
        name, _, value = item.rpartition("=")
        if name == subset or (not name and chosen is None):
            chosen = int(value)
    return chosen


def run_subset(pool: Pool, subset: str, args: argparse.Namespace, started: float) -> list[Task]:
    """Evaluate one subset; writes ``SUBSET.json`` and prints its row and misses."""
    tasks = sample_tasks(subset, subset_limit(args.limit, subset), args.seed)
    done = [0]

    def progress(task: Task) -> None:
        done[0] += 1
        if done[0] % 50 == 0 or done[0] == len(tasks):
            elapsed = time.monotonic() - started
            print(f"# {subset}: {done[0]}/{len(tasks)} ({elapsed:.0f} s)", flush=True)

    pool.run(tasks, progress)
    summary = summarise(tasks, pool.times)
    payload = {
        "subset": subset,
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": summary,
        "schemas": [{"index": t.index, "name": t.name, **t.done} for t in tasks],
    }
    (args.out / f"{subset}.json").write_text(json.dumps(payload, indent=1))
    print(f"{TABLE_HEADER}\n{table_row(subset, summary)}\n\n{misses_markdown(subset, summary)}\n")
    return tasks


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = TokenizerInfo.default()
    xgrammar_tokenizer_info(tokenizer)  # built once here, inherited by the forked workers
    llguidance_tokenizer(tokenizer)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the workers go too
    pool = Pool(args, tokenizer)
    started = time.monotonic()
    try:
        by_subset = {subset: run_subset(pool, subset, args, started) for subset in args.subsets}
    finally:
        pool.close()
    summaries = {subset: summarise(tasks, pool.times) for subset, tasks in by_subset.items()}
    total = summarise([t for tasks in by_subset.values() for t in tasks], pool.times)
    (args.out / "all.json").write_text(json.dumps({"summary": total}, indent=1))
    rows = [table_row(subset, s) for subset, s in summaries.items()]
    notes = [misses_markdown(subset, s) for subset, s in summaries.items()]
    table = "\n".join([TABLE_HEADER, *rows, table_row("**all**", total)])
    report = "\n\n".join([table, MASK_NOTE, *notes]) + "\n"
    (args.out / "summary.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
