"""Do the backends' mask fills and torch's CPU kernels release the GIL? (What overlap needs.)

Two workloads of about the same length (0.5 s), each alone and then both at once on two
threads: ``fill`` fills the bitmask of JSON-schema matchers in states that need real work (after
an object key, inside a number, ...) one row at a time, ``batch fill`` eight rows a call through
the backend's batch call on one worker thread of its own, ``matmul`` runs 256 x 256 float32
matrix products on one torch thread. ``parallel speedup`` =
(time alone + time alone) / time together: 2.0 when neither holds the GIL while it works (and two
cores are free), 1.0 when they take turns. A pure-Python loop is the control (it never releases
the GIL). Medians of ``--repeats``.

Usage::

    HF_HUB_OFFLINE=1 guidedec bench gil [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from guidedec import GuidedDecodingConfig, GuidedDecodingParams, TokenizerInfo
from guidedec.bench.environment import environment
from guidedec.bench.plots import write_report, write_summary
from guidedec.bench.text import plain
from guidedec.bitmask import allocate_bitmask
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcher

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "required": ["name", "age"],
}
SECONDS = 0.5  # each workload alone
BATCH_ROWS = 8
PREFIXES = ['{"name":"Al","age":4', '{"name":"Al","age":42,', '{"name":"Al","age":1,"tags":["x']


def advanced_matchers(backend: str, tokenizer: TokenizerInfo, count: int) -> list[GrammarMatcher]:
    """``count`` matchers in states that need real work (cycling through ``PREFIXES``)."""
    config = GuidedDecodingConfig(
        backend=backend,  # type: ignore[arg-type]
        tokenizer=tokenizer,
        json_whitespace="compact",
    )
    factory = create_grammar_matcher_factory(config)
    params = GuidedDecodingParams(json_schema=json.dumps(SCHEMA))
    matchers = []
    for i in range(count):
        matcher = factory.create(params)
        for token in tokenizer.encode(PREFIXES[i % len(PREFIXES)]):
            assert matcher.accept_token(token)
        matchers.append(matcher)
    return matchers


def fill_work(backend: str, tokenizer: TokenizerInfo, calls: int) -> Callable[[], None]:
    """One row at a time, through ``fill_next_token_bitmask``."""
    matchers = advanced_matchers(backend, tokenizer, len(PREFIXES))
    bitmask = allocate_bitmask(1, tokenizer.vocab_size)

    def work() -> None:
        for i in range(calls):
            matchers[i % len(matchers)].fill_next_token_bitmask(bitmask, 0)

    return work


def batch_fill_work(backend: str, tokenizer: TokenizerInfo, calls: int) -> Callable[[], None]:
    """Eight rows per call through the backend's batch call on one thread of its own (xgrammar's
    ``BatchGrammarMatcher``, llguidance's ``LLExecutor``): does the caller's thread wait for it
    without holding the GIL?"""
    matchers = advanced_matchers(backend, tokenizer, BATCH_ROWS)
    bitmask = allocate_bitmask(BATCH_ROWS, tokenizer.vocab_size)
    batch_fill = type(matchers[0]).fill_next_token_bitmasks
    rows = range(BATCH_ROWS)

    def work() -> None:
        for _ in range(calls):
            batch_fill(matchers, bitmask, rows, num_threads=1)

    return work


def matmul_work(calls: int) -> Callable[[], None]:
    a = torch.randn(256, 256)

    def work() -> None:
        for _ in range(calls):
            a @ a

    return work


def python_work(calls: int) -> Callable[[], None]:
    def work() -> None:
        total = 0
        for i in range(calls * 200):
            total += i * i

    return work


def calibrated(make: Callable[[int], Callable[[], None]], seconds: float) -> Callable[[], None]:
    """``make(calls)`` with as many calls as take about ``seconds`` alone."""
    calls = 50
    while (elapsed := timed(make(calls))) < seconds / 4:
        calls *= 4
    return make(max(1, round(calls * seconds / elapsed)))


def timed(*works: Callable[[], None]) -> float:
    threads = [threading.Thread(target=w) for w in works]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def speedup(a: Callable[[], None], b: Callable[[], None], repeats: int) -> dict[str, float]:
    alone_a = statistics.median(timed(a) for _ in range(repeats))
    alone_b = statistics.median(timed(b) for _ in range(repeats))
    together = statistics.median(timed(a, b) for _ in range(repeats))
    return {
        "a_s": alone_a,
        "b_s": alone_b,
        "together_s": together,
        "speedup": (alone_a + alone_b) / together,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tokenizer = TokenizerInfo.default()
    matmul = calibrated(matmul_work, SECONDS)
    rows = {}
    for backend in ("xgrammar", "llguidance"):
        fill = calibrated(functools.partial(fill_work, backend, tokenizer), SECONDS)
        rows[f"{backend} fill + matmul"] = speedup(fill, matmul, args.repeats)
        batch = calibrated(functools.partial(batch_fill_work, backend, tokenizer), SECONDS)
        rows[f"{backend} batch fill (1 thread) + matmul"] = speedup(batch, matmul, args.repeats)
    control = calibrated(python_work, SECONDS)
    rows["python loop + matmul (control)"] = speedup(control, matmul, args.repeats)
    lines = [
        "| workloads | alone (s) | alone (s) | together (s) | parallel speedup |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['a_s']:.3f} | {r['b_s']:.3f} | {r['together_s']:.3f} "
            f"| {r['speedup']:.2f}x |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        report = {"argv": sys.argv[1:], **environment(), "rows": rows}
        write_report(args.out, "bench_gil", report)
        write_summary(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
