"""End-to-end generated tokens/s of ``guidedec.LLM``: unguided vs guided by a JSON schema.

One ``tiny-random`` engine serves both modes, on the same prompts, with the same seeded sampling
(temperature 1). Every request generates exactly ``--tokens`` tokens in both modes (asserted):
the guide is an array of at least ``tokens + 1`` objects of ``examples/person.schema.json``,
which cannot be complete within ``tokens`` tokens, so it never lets the end-of-sequence token
through; unguided, the seeds are fixed, and the run checks that none of them samples it. The
two modes alternate (their order flips every round) so that load noise hits both; each cell is
the median of ``--repeats`` rounds, the ratio is the median of the per-round guided/unguided
ratios (also by process CPU time, which other load on the machine disturbs less), and the
guided overhead is ``LLM.stats.guide_s`` over the run's wall time. torch runs on ``--threads``
threads (default 1: on a small shared machine a second intra-op thread did not speed
``tiny-random`` up, and made a run up to 5x slower whenever another process took a core).
``--out DIR`` also writes ``bench_e2e.json``.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_e2e.py``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.environment import environment
from guidedec.bench.plots import grouped_bars, write_summary

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "examples" / "person.schema.json"
MODES = ("unguided", "guided")
TARGET_RATIO = 0.95  # guided tokens/s over unguided, at the largest batch


@dataclass(frozen=True)
class Sample:
    """One timed ``generate`` call."""

    tokens: int
    seconds: float  # wall clock
    cpu_s: float  # this process's CPU time (all threads): less sensitive to other load
    guide_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s


def bench_schema(tokens: int) -> dict[str, Any]:
    """An array of at least ``tokens + 1`` persons: no output of ``tokens`` tokens completes it
    (every item takes at least one token), so guided requests always run to ``max_tokens``."""
    person = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    person.pop("$schema", None)
    return {"type": "array", "items": person, "minItems": tokens + 1}


def make_params(
    mode: str, batch: int, tokens: int, guide: GuidedDecodingParams, seed: int
) -> list[SamplingParams]:
    return [
        SamplingParams(
            max_tokens=tokens,
            temperature=1.0,
            seed=seed + i,
            guided_decoding=guide if mode == "guided" else None,
        )
        for i in range(batch)
    ]


def measure(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> Sample:
    """Run one batch; every request must have generated exactly ``max_tokens`` tokens."""
    guide_before = llm.stats.guide_s
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    wanted = params[0].max_tokens
    for out in outputs:
        if out.finish_reason != "length" or len(out.token_ids) != wanted:
            raise AssertionError(
                f"request {out.request_id} ended with {out.finish_reason} after "
                f"{len(out.token_ids)} of {wanted} tokens ({out.error}): change --seed"
            )
    return Sample(len(outputs) * wanted, seconds, cpu_s, llm.stats.guide_s - guide_before)


def run_rounds(
    llm: LLM, args: argparse.Namespace, guide: GuidedDecodingParams
) -> dict[int, dict[str, list[Sample]]]:
    """``args.repeats`` rounds; in each, every batch size runs both modes, the order flipping."""
    prompts = [f"Record {i}: a person, as JSON." for i in range(max(args.batches))]
    samples: dict[int, dict[str, list[Sample]]] = {b: {m: [] for m in MODES} for b in args.batches}
    for round_index in range(args.repeats):
        for batch_index, batch in enumerate(args.batches):
            flip = (round_index + batch_index) % 2 == 1
            for mode in reversed(MODES) if flip else MODES:
                params = make_params(mode, batch, args.tokens, guide, args.seed)
                samples[batch][mode].append(measure(llm, prompts[:batch], params))
    return samples


def warm_up(llm: LLM, guide: GuidedDecodingParams, batch: int, seed: int) -> None:
    """Compile the guide and warm the model up in both modes (not timed)."""
    prompts = [f"Warm-up {i}" for i in range(batch)]
    for mode in MODES:
        llm.generate(prompts, make_params(mode, batch, 4, guide, seed))


def summarize(batch: int, samples: dict[str, list[Sample]]) -> dict[str, Any]:
    unguided, guided = samples["unguided"], samples["guided"]
    pairs = list(zip(guided, unguided, strict=True))
    ratios = [g.tokens_per_s / u.tokens_per_s for g, u in pairs]
    cpu_ratios = [g.tokens_per_cpu_s / u.tokens_per_cpu_s for g, u in pairs]
    return {
        "batch": batch,
        "tokens": guided[0].tokens,
        "unguided_tokens_per_s": statistics.median(s.tokens_per_s for s in unguided),
        "guided_tokens_per_s": statistics.median(s.tokens_per_s for s in guided),
        "ratio": statistics.median(ratios),
        "cpu_time_ratio": statistics.median(cpu_ratios),
        "guided_overhead_pct": statistics.median(100 * s.guide_s / s.seconds for s in guided),
        "samples": {mode: [asdict(s) for s in runs] for mode, runs in samples.items()},
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| batch | tokens per run | unguided tok/s | guided tok/s | guided / unguided "
        "| guided overhead (guide_s / wall) | guided / unguided (CPU time) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['tokens']} | {r['unguided_tokens_per_s']:.1f} "
            f"| {r['guided_tokens_per_s']:.1f} | {r['ratio']:.3f}x "
            f"| {r['guided_overhead_pct']:.1f}% | {r['cpu_time_ratio']:.3f}x |"
        )
    return "\n".join(lines)


def target_line(rows: list[dict[str, Any]]) -> str:
    last = rows[-1]
    verdict = "met" if last["ratio"] >= TARGET_RATIO else "NOT met"
    return (
        f"target: guided >= {TARGET_RATIO:.2f}x unguided at batch {last['batch']}: "
        f"{last['ratio']:.3f}x, {verdict}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of both modes")
    parser.add_argument("--backend", default="auto", choices=["auto", "xgrammar", "llguidance"])
    parser.add_argument("--seed", type=int, default=0, help="request i samples with seed + i")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, help="directory for bench_e2e.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.batches = sorted(set(args.batches))
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    llm = LLM("tiny-random", backend=args.backend, max_num_seqs=max(args.batches))
    guide = GuidedDecodingParams(json_schema=bench_schema(args.tokens))
    warm_up(llm, guide, max(args.batches), args.seed)
    samples = run_rounds(llm, args, guide)
    rows = [summarize(batch, samples[batch]) for batch in args.batches]
    text = (
        f"{header(args, load, os.getloadavg()[0])}\n\n{markdown_table(rows)}\n\n{target_line(rows)}"
    )
    print(text)
    if args.out is not None:
        write_json(args, load, rows)
        write_summary(args.out, text)
        grouped_bars(
            args.out / "bench_e2e.png",
            title=f"tiny-random, {args.tokens} tokens per request (median tok/s)",
            ylabel="tokens / s",
            groups=[f"batch {r['batch']}" for r in rows],
            series={
                "unguided": [r["unguided_tokens_per_s"] for r in rows],
                "guided": [r["guided_tokens_per_s"] for r in rows],
            },
            label_format="%.1f",
        )
        print(f"wrote {args.out / 'summary.md'}, {args.out / 'bench_e2e.png'}")


def header(args: argparse.Namespace, load: float, load_end: float) -> str:
    return (
        f"model: tiny-random; backend: {args.backend}; {args.tokens} tokens per request in both "
        f"modes; guide: array (minItems {args.tokens + 1}) of {SCHEMA_FILE.name}; temperature 1; "
        f"repeats: {args.repeats}; torch threads: {torch.get_num_threads()}; "
        f"load avg: {load:.2f} at start, {load_end:.2f} at end\n"
        "tok/s: medians over repeats (wall clock); ratios: medians of per-round pairs"
    )


def write_json(args: argparse.Namespace, load: float, rows: list[dict[str, Any]]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "argv": sys.argv[1:],
        "model": "tiny-random",
        "backend": args.backend,
        "tokens_per_request": args.tokens,
        "guide": {"schema_file": f"examples/{SCHEMA_FILE.name}", "min_items": args.tokens + 1},
        "temperature": 1.0,
        "repeats": args.repeats,
        "seed": args.seed,
        "target_ratio": TARGET_RATIO,
        **environment(),
        "load_average_at_start": load,
        "rows": rows,
    }
    path = args.out / "bench_e2e.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
