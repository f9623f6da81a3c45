"""Benchmark parallel mask fill across a batch against one row at a time, per backend.

Each row (backend x batch size B) drives B JSON-schema matchers (request ``i`` follows case
``i % len(CASES)`` of :mod:`guidedec.bench.cases`, token by token through ``json.dumps`` of its
instance) and, at every step, fills the B rows three ways, in a seeded random order:

- **sequential**: ``fill_next_token_bitmask`` per matcher (what a decoder does without
  parallelism);
- **parallel**: the backend's batch call on ``--threads`` threads (xgrammar's
  ``BatchGrammarMatcher``, llguidance's ``LLExecutor``) via
  ``GrammarMatcher.fill_next_token_bitmasks``;
- **auto**: ``BatchFiller("auto")``, which times both ways on the live batches and keeps the
  faster: the decoder's default.

The first repeat checks that all three fill identical bitmasks. A repeat is one pass over the
steps from fresh matchers (matcher creation and compilation are not timed). Reported: median
per-step microseconds of each way, ``speedup`` = sequential / parallel and ``auto`` /
best-of-two, both as medians of per-repeat ratios (paired, so machine noise cancels). What
``auto`` settled on per bucket is listed too. Prints a Markdown table; ``--out DIR`` also
writes ``bench_fill.json`` and a plot.

Run: ``HF_HUB_OFFLINE=1 guidedec bench fill``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from guidedec import GuidedDecodingConfig, GuidedDecodingParams, TokenizerInfo
from guidedec.bench.cases import JSON_CASES
from guidedec.bench.environment import environment
from guidedec.bench.plots import grouped_bars, write_report, write_summary
from guidedec.bench.text import plain
from guidedec.bitmask import allocate_bitmask
from guidedec.grammar.batch_fill import BatchFiller, default_fill_threads
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcher, GrammarMatcherFactory, fill_one_by_one

BACKENDS = ("xgrammar", "llguidance")
WAYS = ("sequential", "parallel", "auto")


def make_matchers(
    factory: GrammarMatcherFactory, cases: list[tuple[GuidedDecodingParams, list[int]]], n: int
) -> list[GrammarMatcher]:
    return [factory.create(cases[i % len(cases)][0]) for i in range(n)]


def run_repeat(
    factory: GrammarMatcherFactory,
    cases: list[tuple[GuidedDecodingParams, list[int]]],
    batch: int,
    threads: int,
    filler: BatchFiller,
    rng: random.Random,
    *,
    vocab_size: int,
    check: bool,
) -> dict[str, float]:
    """One pass over the steps; returns the seconds each way took, summed over the steps."""
    steps = min(len(tokens) for _, tokens in cases)
    matchers = make_matchers(factory, cases, batch)
    rows = list(range(batch))
    masks = {way: allocate_bitmask(batch, vocab_size) for way in WAYS}
    cls = type(matchers[0])
    spent = dict.fromkeys(WAYS, 0.0)
    for step in range(steps):
        order = list(WAYS)
        rng.shuffle(order)
        for way in order:
            start = time.perf_counter()
            if way == "sequential":
                errors = fill_one_by_one(matchers, masks[way], rows)
            elif way == "parallel":
                errors = cls.fill_next_token_bitmasks(
                    matchers, masks[way], rows, num_threads=threads
                )
            else:
                errors = filler.fill(matchers, masks[way], rows)
            spent[way] += time.perf_counter() - start
            if any(errors):
                raise RuntimeError(f"{way} fill failed: {errors}")
        if check and not all(torch.equal(masks["sequential"], masks[w]) for w in WAYS[1:]):
            raise RuntimeError(f"the three ways filled different bitmasks at step {step}")
        for i, matcher in enumerate(matchers):
            if not matcher.accept_token(cases[i % len(cases)][1][step]):
                raise RuntimeError(f"case {i % len(cases)} rejected its own token {step}")
    return {way: seconds / steps for way, seconds in spent.items()}


def measure(
    backend: str,
    tokenizer: TokenizerInfo,
    batch: int,
    threads: int,
    repeats: int,
    rng: random.Random,
) -> dict[str, Any]:
    config = GuidedDecodingConfig(backend=backend, tokenizer=tokenizer)  # type: ignore[arg-type]
    factory = create_grammar_matcher_factory(config)
    cases = [
        (GuidedDecodingParams(json_schema=schema), tokenizer.encode(json.dumps(instance)))
        for schema, instance in JSON_CASES
    ]
    filler = BatchFiller("auto", threads)
    per_way: dict[str, list[float]] = {way: [] for way in WAYS}
    for repeat in range(repeats + 1):
        times = run_repeat(
            factory,
            cases,
            batch,
            threads,
            filler,
            rng,
            vocab_size=tokenizer.vocab_size,
            check=repeat == 0,
        )
        if repeat == 0:
            continue  # warm-up (and the check): thread pools start, caches fill
        for way in WAYS:
            per_way[way].append(times[way])
    speedups = [s / p for s, p in zip(per_way["sequential"], per_way["parallel"], strict=True)]
    auto_vs_best = [
        a / min(s, p)
        for s, p, a in zip(per_way["sequential"], per_way["parallel"], per_way["auto"], strict=True)
    ]
    return {
        "backend": backend,
        "batch": batch,
        "threads": threads,
        "steps": min(len(tokens) for _, tokens in cases),
        **{f"{way}_us": statistics.median(per_way[way]) * 1e6 for way in WAYS},
        "speedup": statistics.median(speedups),
        "auto_vs_best": statistics.median(auto_vs_best),
        "auto_choice": {f"{b}:{size}": c for (b, size), c in filler.decisions().items()},
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | B | threads | sequential µs | parallel µs | speedup | auto µs | auto / best "
        "| auto chose |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        chose = ", ".join(f"{k.split(':')[1]}+: {v}" for k, v in r["auto_choice"].items())
        lines.append(
            f"| {r['backend']} | {r['batch']} | {r['threads']} | {r['sequential_us']:.0f} "
            f"| {r['parallel_us']:.0f} | {r['speedup']:.2f}x | {r['auto_us']:.0f} "
            f"| {r['auto_vs_best']:.2f} | {chose} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128])
    parser.add_argument(
        "--threads", type=int, default=default_fill_threads(), help="threads of a parallel fill"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per row")
    parser.add_argument("--seed", type=int, default=0, help="seeds the order of the three ways")
    parser.add_argument("--out", type=Path, help="directory for bench_fill.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    tokenizer = TokenizerInfo.default()
    rng = random.Random(args.seed)
    rows = [
        measure(backend, tokenizer, batch, args.threads, args.repeats, rng)
        for backend in args.backends
        for batch in args.batches
    ]
    text = (
        f"vocab: {tokenizer.vocab_size:,}; {len(JSON_CASES)} JSON-schema cases; "
        f"threads: {args.threads} of {os.cpu_count()} CPUs; repeats: {args.repeats}; "
        f"load avg: {load:.2f}; per-step medians; ratios are medians of per-repeat pairs\n\n"
        + markdown_table(rows)
    )
    print(text)
    if args.out is None:
        return
    report = {
        "argv": sys.argv[1:],
        "repeats": args.repeats,
        "seed": args.seed,
        **environment(),
        "load_average_at_start": load,
        "rows": rows,
    }
    path = write_report(args.out, "bench_fill", report)
    write_summary(args.out, text)
    grouped_bars(
        args.out / "bench_fill.png",
        title=f"Parallel mask fill over one row at a time ({args.threads} threads, median)",
        ylabel="speedup (x)",
        groups=[f"B={b}" for b in args.batches],
        series={
            backend: [r["speedup"] for r in rows if r["backend"] == backend]
            for backend in args.backends
        },
        label_format="%.2f",
        reference=1.0,
    )
    print(f"wrote {path}, {args.out / 'summary.md'}, {args.out / 'bench_fill.png'}")


if __name__ == "__main__":
    main()
