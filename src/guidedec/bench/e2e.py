"""End-to-end generated tokens/s of ``guidedec.LLM``: unguided vs guided by a JSON schema, the
guided engine building its masks after the forward ("sequential") or while it runs
("overlapped", with ``jump_forward=False``), and overlapped with jump-forward, the default
("jump-forward": the grammar's forced tokens proposed as drafts; a second engine with the same
weights); against
``transformers`` ``model.generate`` running guidedec's
``GuidedLogitsProcessor`` on a left-padded batch of the same prompts, same weights and same
tokens per request ("transformers"); and the peak RSS of a guided batch with the batched runner
against the per-sequence runner (fresh processes, ``--rss-batch``).

One ``tiny-random`` engine serves the other engine modes, on the same prompts, with the same seeded
sampling (temperature 1). Every request generates exactly ``--tokens`` tokens in every mode
(asserted):
the guide is an array of at least ``tokens + 1`` objects of ``examples/person.schema.json``,
which cannot be complete within ``tokens`` tokens, so it never lets the end-of-sequence token
through; unguided, the seeds are fixed, and the run checks that none of them samples it. The
modes alternate (their order rotates every round) so that load noise hits all; each cell is
the median of ``--repeats`` rounds, a ratio is the median of the per-round guided/unguided
ratios (also by process CPU time, which other load on the machine disturbs less), and the
guided overhead is ``LLM.stats.guide_s`` over the run's wall time. torch runs on ``--threads``
threads (default 1: on a small shared machine a second intra-op thread did not speed
``tiny-random`` up, and made a run up to 5x slower whenever another process took a core).
``--out DIR`` also writes ``bench_e2e.json``.

Run: ``HF_HUB_OFFLINE=1 guidedec bench e2e``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.cases import person_array_schema
from guidedec.bench.e2e_baselines import peak_rss_kib, transformers_generate
from guidedec.bench.environment import environment
from guidedec.bench.plots import grouped_bars, write_report, write_summary
from guidedec.bench.text import plain

MODES = ("unguided", "sequential", "overlapped", "jump-forward", "transformers")
GUIDED_MODES = MODES[1:4]  # the engine's
TARGET_JUMP = 1.1  # jump-forward guided tokens/s over unguided, batch 8
TARGET_RATIO = 0.95  # overlapped guided tokens/s over unguided, at every batch of TARGET_BATCHES
TARGET_BATCHES = (8, 32)
TARGET_SCALING = {8: 4.0, 32: 6.0}  # overlapped guided tokens/s at batch b over batch 1
TARGET_VS_TRANSFORMERS = 1.0  # overlapped guided tokens/s over transformers, TARGET_BATCHES
TARGET_RSS = 1.5  # peak RSS, batched over per-sequence runner


@dataclass(frozen=True)
class Sample:
    """One timed ``generate`` call."""

    tokens: int
    seconds: float  # wall clock
    cpu_s: float  # this process's CPU time (all threads): less sensitive to other load
    guide_s: float
    forced: tuple[int, int] = (0, 0)  # forced draft tokens proposed, accepted (jump-forward)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s


def make_params(
    mode: str, batch: int, tokens: int, guide: GuidedDecodingParams, seed: int
) -> list[SamplingParams]:
    return [
        SamplingParams(
            max_tokens=tokens,
            temperature=1.0,
            seed=seed + i,
            guided_decoding=None if mode == "unguided" else guide,
        )
        for i in range(batch)
    ]


def measure(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> Sample:
    """Run one batch; every request must have generated exactly ``max_tokens`` tokens."""
    guide_before = llm.stats.guide_s
    forced_before = (llm.stats.forced_draft_tokens, llm.stats.accepted_forced_tokens)
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
    forced = (
        llm.stats.forced_draft_tokens - forced_before[0],
        llm.stats.accepted_forced_tokens - forced_before[1],
    )
    return Sample(len(outputs) * wanted, seconds, cpu_s, llm.stats.guide_s - guide_before, forced)


def run_rounds(
    llm: LLM, jumper: LLM, args: argparse.Namespace, guide: GuidedDecodingParams
) -> dict[int, dict[str, list[Sample]]]:
    """``args.repeats`` rounds; in each, every batch size runs every mode, the order rotating."""
    prompts = [f"Record {i}: a person, as JSON." for i in range(max(args.batches))]
    samples: dict[int, dict[str, list[Sample]]] = {b: {m: [] for m in MODES} for b in args.batches}
    for round_index in range(args.repeats):
        for batch_index, batch in enumerate(args.batches):
            shift = (round_index + batch_index) % len(MODES)
            for mode in MODES[shift:] + MODES[:shift]:
                if mode == "transformers":
                    counts = transformers_generate(
                        llm, prompts[:batch], args.tokens, guide, args.seed + round_index
                    )
                    samples[batch][mode].append(Sample(*counts, guide_s=0.0))
                    continue
                engine = jumper if mode == "jump-forward" else llm
                engine.overlap = mode != "sequential"
                params = make_params(mode, batch, args.tokens, guide, args.seed)
                samples[batch][mode].append(measure(engine, prompts[:batch], params))
    return samples


def warm_up(llm: LLM, jumper: LLM, guide: GuidedDecodingParams, batch: int, seed: int) -> None:
    """Compile the guide and warm the model up in every mode (not timed)."""
    prompts = [f"Warm-up {i}" for i in range(batch)]
    for mode in MODES[:3]:
        llm.generate(prompts, make_params(mode, batch, 4, guide, seed))
    jumper.generate(prompts, make_params("jump-forward", batch, 4, guide, seed))
    transformers_generate(llm, prompts, 4, guide, seed)


def summarize(batch: int, samples: dict[str, list[Sample]]) -> dict[str, Any]:
    unguided = samples["unguided"]
    row: dict[str, Any] = {
        "batch": batch,
        "tokens": unguided[0].tokens,
        "unguided_tokens_per_s": statistics.median(s.tokens_per_s for s in unguided),
    }
    for mode in GUIDED_MODES:
        guided = samples[mode]
        pairs = list(zip(guided, unguided, strict=True))
        row[f"{mode}_tokens_per_s"] = statistics.median(s.tokens_per_s for s in guided)
        row[f"{mode}_ratio"] = statistics.median(g.tokens_per_s / u.tokens_per_s for g, u in pairs)
        row[f"{mode}_cpu_time_ratio"] = statistics.median(
            g.tokens_per_cpu_s / u.tokens_per_cpu_s for g, u in pairs
        )
        row[f"{mode}_overhead_pct"] = statistics.median(100 * s.guide_s / s.seconds for s in guided)
    jumped = samples["jump-forward"]
    row["forced_proposed"] = sum(s.forced[0] for s in jumped)
    row["forced_accepted"] = sum(s.forced[1] for s in jumped)
    hf = samples["transformers"]
    row["transformers_tokens_per_s"] = statistics.median(s.tokens_per_s for s in hf)
    row["overlapped_vs_transformers"] = statistics.median(
        g.tokens_per_s / t.tokens_per_s for g, t in zip(samples["overlapped"], hf, strict=True)
    )
    row["samples"] = {mode: [asdict(s) for s in runs] for mode, runs in samples.items()}
    return row


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| batch | tokens per run | unguided tok/s | guided tok/s, sequential | guided tok/s, "
        "overlapped | guided tok/s, jump-forward | transformers + processor tok/s | "
        "sequential / unguided | overlapped / unguided | jump-forward / unguided | forced "
        "tokens accepted | overlapped / transformers | overlapped vs batch 1 | guided overhead "
        "(sequential / overlapped) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['tokens']} | {r['unguided_tokens_per_s']:.1f} "
            f"| {r['sequential_tokens_per_s']:.1f} | {r['overlapped_tokens_per_s']:.1f} "
            f"| {r['jump-forward_tokens_per_s']:.1f} | {r['transformers_tokens_per_s']:.1f} "
            f"| {r['sequential_ratio']:.3f}x | {r['overlapped_ratio']:.3f}x "
            f"| {r['jump-forward_ratio']:.3f}x "
            f"| {r['forced_accepted']} of {r['forced_proposed']} "
            f"| {r['overlapped_vs_transformers']:.2f}x | {_scaling(rows, r)} "
            f"| {r['sequential_overhead_pct']:.1f}% / {r['overlapped_overhead_pct']:.1f}% |"
        )
    return "\n".join(lines)


def _scaling(rows: list[dict[str, Any]], row: dict[str, Any]) -> str:
    ratio = scaling(rows, row["batch"])
    return "" if ratio is None else f"{ratio:.2f}x"


def scaling(rows: list[dict[str, Any]], batch: int) -> float | None:
    """Overlapped guided tok/s at ``batch`` over batch 1 (None without a batch-1 row)."""
    by_batch = {r["batch"]: r["overlapped_tokens_per_s"] for r in rows}
    return by_batch[batch] / by_batch[1] if 1 in by_batch and batch in by_batch else None


def target_lines(rows: list[dict[str, Any]], rss: dict[str, int] | None) -> str:
    """One line per target the run can judge: met or NOT met, with the measured figure."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = []
    by_batch = {r["batch"]: r for r in rows}
    for batch in TARGET_BATCHES:
        row = by_batch.get(batch)
        if row is None:
            continue
        ratio, hf = row["overlapped_ratio"], row["overlapped_vs_transformers"]
        lines.append(
            f"target: guided (overlapped) >= {TARGET_RATIO:.2f}x unguided at batch {batch}: "
            f"{ratio:.3f}x, {verdict(ratio >= TARGET_RATIO)}"
        )
        lines.append(
            f"target: guided (overlapped) >= {TARGET_VS_TRANSFORMERS:.1f}x transformers + "
            f"GuidedLogitsProcessor at batch {batch}: {hf:.2f}x, "
            f"{verdict(hf >= TARGET_VS_TRANSFORMERS)}"
        )
        grown = scaling(rows, batch)
        if grown is not None:
            lines.append(
                f"target: guided tok/s at batch {batch} >= {TARGET_SCALING[batch]:.0f}x batch 1: "
                f"{grown:.2f}x, {verdict(grown >= TARGET_SCALING[batch])}"
            )
    row = by_batch.get(8)
    if row is not None:
        jump = row["jump-forward_ratio"]
        lines.append(
            f"target: guided with jump-forward >= {TARGET_JUMP:.1f}x unguided at batch 8: "
            f"{jump:.3f}x, {verdict(jump >= TARGET_JUMP)}"
        )
    if rss is not None:
        ratio = rss["batched"] / rss["per-sequence"]
        lines.append(
            f"target: peak RSS of a guided batch, batched <= {TARGET_RSS}x per-sequence runner: "
            f"{rss['batched'] / 1024:.0f} MiB vs {rss['per-sequence'] / 1024:.0f} MiB = "
            f"{ratio:.2f}x, {verdict(ratio <= TARGET_RSS)}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of all three modes")
    parser.add_argument("--backend", default="auto", choices=["auto", "xgrammar", "llguidance"])
    parser.add_argument("--seed", type=int, default=0, help="request i samples with seed + i")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--rss-batch", type=int, default=32, help="batch of the peak-RSS runs (0: skip them)"
    )
    parser.add_argument("--out", type=Path, help="directory for bench_e2e.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.batches = sorted(set(args.batches))
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    llm = LLM(
        "tiny-random", backend=args.backend, max_num_seqs=max(args.batches), jump_forward=False
    )
    jumper = LLM(
        "tiny-random", backend=args.backend, max_num_seqs=max(args.batches), jump_forward=True
    )
    guide = GuidedDecodingParams(json_schema=person_array_schema(args.tokens))
    warm_up(llm, jumper, guide, max(args.batches), args.seed)
    samples = run_rounds(llm, jumper, args, guide)
    rows = [summarize(batch, samples[batch]) for batch in args.batches]
    llm.close()
    jumper.close()
    rss = (
        peak_rss_kib(args.rss_batch, args.tokens, person_array_schema(args.tokens))
        if args.rss_batch
        else None
    )
    text = (
        f"{header(args, load, os.getloadavg()[0])}\n\n{markdown_table(rows)}\n\n"
        f"{target_lines(rows, rss)}"
    )
    print(text)
    if args.out is not None:
        write_json(args, load, rows, rss)
        write_summary(args.out, text)
        grouped_bars(
            args.out / "bench_e2e.png",
            title=f"tiny-random, {args.tokens} tokens per request (median tok/s)",
            ylabel="tokens / s",
            groups=[f"batch {r['batch']}" for r in rows],
            series={
                "unguided": [r["unguided_tokens_per_s"] for r in rows],
                **{f"guided, {m}": [r[f"{m}_tokens_per_s"] for r in rows] for m in GUIDED_MODES},
                "guided, transformers": [r["transformers_tokens_per_s"] for r in rows],
            },
            label_format="%.1f",
        )
        print(f"wrote {args.out / 'summary.md'}, {args.out / 'bench_e2e.png'}")


def header(args: argparse.Namespace, load: float, load_end: float) -> str:
    return (
        f"model: tiny-random; backend: {args.backend}; {args.tokens} tokens per request in every "
        f"mode; guide: array (minItems {args.tokens + 1}) of person.schema.json; temperature 1; "
        f"repeats: {args.repeats}; torch threads: {torch.get_num_threads()}; "
        f"load avg: {load:.2f} at start, {load_end:.2f} at end\n"
        "tok/s: medians over repeats (wall clock); ratios: medians of per-round pairs; guided "
        "overhead: time guided decoding added after the forward, over wall time; transformers: "
        "model.generate + GuidedLogitsProcessor, same weights, left padding"
    )


def write_json(
    args: argparse.Namespace, load: float, rows: list[dict[str, Any]], rss: dict[str, int] | None
) -> None:
    report = {
        "argv": sys.argv[1:],
        "model": "tiny-random",
        "backend": args.backend,
        "tokens_per_request": args.tokens,
        "guide": {"schema_file": "examples/person.schema.json", "min_items": args.tokens + 1},
        "temperature": 1.0,
        "repeats": args.repeats,
        "seed": args.seed,
        "target_ratio": TARGET_RATIO,
        **environment(),
        "load_average_at_start": load,
        "rows": rows,
        "peak_rss_kib": rss,
        "rss_batch": args.rss_batch,
    }
    path = write_report(args.out, "bench_e2e", report)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
