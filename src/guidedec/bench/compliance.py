"""Compliance benchmark: how each backend handles JSON schemas from public test data.

Per schema and backend, in forked worker processes watched by the parent:

- compile: success or the error, and the compile time (past ``--timeout`` seconds: a failure);
- instances: every valid test instance (``json.dumps(data)``, tokenised) must be allowed by a
  mask filled before each token and accepted, stop token included (else a false negative); every
  invalid one must be rejected (else a false positive);
- generation: seeded random-logits guided generation; the outputs that terminate must validate
  with ``jsonschema`` (compliance = valid / terminated); with ``--model``, also the reference
  engine on that model (a greedy and a sampled output, prompted with the schema);
- mask times: every ``fill_next_token_bitmask`` above, in microseconds.

A compile past its deadline, a hang or a crash kills that worker only; it is counted against the
backend, and the schema goes on in a fresh worker.

DATA is a JSONSchemaBench/MaskBench ``.jsonl`` file (lines ``{"schema", "tests": [{"data",
"valid"}]}``), a JSON-Schema-Test-Suite file (``[{"description", "schema", "tests"}]``) or a
directory of them (its top-level ``*.json``). Each file (or directory) is a subset.

Writes ``summary.md`` (also printed; with all three backends it also compares ``auto`` with the
per-schema better of the two), ``misses.md`` (every schema a backend does not cover and every
non-compliant output, with the cause), ``compliance.json`` (summaries and per-schema records),
``coverage.png`` and ``mask_times.png`` under ``--out``; the backends' own warnings go to
``workers.log`` there.

Usage::

    guidedec bench compliance path/to/jsonschemabench/JME.jsonl --limit 20
    python -m guidedec.bench.compliance DATA... [--backend NAME]... [--limit N] [--timeout S]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from guidedec.bench.compliance_pool import Pool
from guidedec.bench.compliance_worker import ALL, Task

WORKERS = 2
PHASE_TIMEOUT_FACTOR = 12  # instance checks and generation: this many times --timeout
DEFAULT_OUT = Path("bench-out/compliance")


class DataError(Exception):
    """A DATA argument that cannot be read."""


def read_jsonl(path: Path) -> list[tuple[str, Any, list[dict[str, Any]]]]:
    """(name, schema, tests) of each line (split on ``\\n`` only: some lines hold U+2028)."""
    items = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(line for line in lines if line.strip()):
        record = json.loads(line)
        name = str(record.get("file", f"{path.stem}_{i}"))
        items.append((name, record["schema"], list(record.get("tests", []))))
    return items


def read_test_suite_file(path: Path) -> list[tuple[str, Any, list[dict[str, Any]]]]:
    groups = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(groups, list):
        raise DataError(f"{path}: not a JSON-Schema-Test-Suite file (a list of test groups)")
    return [
        (f"{path.stem}: {g.get('description', i)}", g["schema"], list(g["tests"]))
        for i, g in enumerate(groups)
    ]


def load_subset(path: Path) -> tuple[str, list[tuple[str, Any, list[dict[str, Any]]]]]:
    """The subset name and its (name, schema, tests) items."""
    try:
        if path.is_dir():
            files = sorted(path.glob("*.json"))
            if not files:
                raise DataError(f"{path}: no *.json files")
            return path.name, [item for f in files for item in read_test_suite_file(f)]
        if path.suffix == ".jsonl":
            return path.stem, read_jsonl(path)
        return path.stem, read_test_suite_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: {type(exc).__name__}: {exc}") from exc


def make_tasks(paths: Sequence[Path], limit: int | None, backends: tuple[str, ...]) -> list[Task]:
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for path in paths:
        subset, items = load_subset(path)
        if subset in seen:  # two DATA with the same name stay apart
            seen[subset] += 1
            subset = f"{subset}#{seen[subset]}"
        seen.setdefault(subset, 1)
        for index, (name, schema, tests) in enumerate(items[:limit]):
            tasks.append(Task(subset, index, name, schema, tests, backends))
    return tasks


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="guidedec bench compliance",
        description="Compile coverage, false positives/negatives, generation compliance and "
        "mask times of each backend on JSON-schema test data.",
    )
    parser.add_argument("data", nargs="+", type=Path, metavar="DATA", help=".jsonl, .json or dir")
    parser.add_argument(
        "--backend",
        action="append",
        choices=ALL,
        help="repeat for several (default: all three)",
    )
    parser.add_argument("--limit", type=int, default=None, help="first N schemas per subset")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile timeout, s")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--no-approximate",
        dest="approximate",
        action="store_false",
        help="auto refuses a schema no backend enforces exactly instead of approximating it",
    )
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="also generate with the reference engine on this model (e.g. tiny-random): "
        "a greedy and a sampled output per schema and backend, prompted with the schema",
    )
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")
    return args


def record(task: Task) -> dict[str, Any]:
    return {"subset": task.subset, "index": task.index, "name": task.name, "backends": task.done}


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran (whatever the backends did), 1 on unreadable DATA."""
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    backends = tuple(name for name in ALL if name in (args.backend or ALL))
    try:
        tasks = make_tasks(args.data, args.limit, backends)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)

    from guidedec.bench.report import markdown, mask_times, misses_markdown, plot, summarise

    tqdm = importlib.import_module("tqdm").tqdm  # untyped (no stubs installed)
    tqdm.monitor_interval = 0  # no monitor thread
    started = time.monotonic()
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # SIGTERM ends the run through ``finally``, so that the workers go too
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    log = args.out / "workers.log"  # the backends' own warnings, kept off the terminal
    log.write_text("", encoding="utf-8")
    pool = Pool(
        WORKERS,
        args.timeout,
        PHASE_TIMEOUT_FACTOR * args.timeout,
        log=log,
        model=args.model,
        approximate=args.approximate,
    )
    try:
        with tqdm(total=len(tasks), file=sys.stderr, unit="schema", dynamic_ncols=True) as bar:
            pool.run(tasks, lambda task: bar.update(1))
    finally:
        pool.close()
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    elapsed = time.monotonic() - started

    subsets = list(dict.fromkeys(t.subset for t in tasks))
    by_subset = {s: [t for t in tasks if t.subset == s] for s in subsets}
    summaries = {s: summarise(ts, backends, pool.times) for s, ts in by_subset.items()}
    if len(subsets) > 1:
        summaries["all"] = summarise(tasks, backends, pool.times)
    report = markdown(summaries) + f"\n{len(tasks)} schemas in {elapsed:.1f} s.\n"
    (args.out / "summary.md").write_text(report, encoding="utf-8")
    (args.out / "misses.md").write_text(misses_markdown(tasks, backends), encoding="utf-8")
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "elapsed_s": elapsed,
        "summary": summaries,
        "schemas": [record(t) for t in tasks],
    }
    (args.out / "compliance.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    plot(args.out, summaries, {b: mask_times(tasks, b, pool.times) for b in backends})
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
