"""Benchmark the host-side cost of ``GuidedDecoder`` per step against the raw backend calls.

Each row (backend x batch size B x draft tokens K) drives B requests through realistic
JSON-schema guides on the default tokenizer (V = 129,280): request ``i`` follows case
``i % len(CASES)``, and its tokens are those of ``json.dumps(instance)``, so every token is valid
(the stop token is never fed). Two paths do exactly the same grammar work, in the same run:

- **decoder**: per step ``add_batch`` (generation snapshots: the new token plus K drafts),
  ``build()`` (advance the matchers, fill ``B * (1 + K)`` rows) and, for K > 0,
  ``rollback_rejected_batch([1 + A] * B)`` with ``A = K // 2`` accepted drafts, so ``K - A``
  tokens per request are rolled back;
- **raw**: the backend objects themselves (``xgrammar.GrammarMatcher``, ``llguidance.LLMatcher``)
  per request: accept the new token, fill its row, accept each draft token and fill the next row
  (same rows, same int32 bitmask layout), then roll back ``K - A`` tokens.

A *repeat* is one run of S steps from fresh matchers, advancing ``1 + A`` tokens per step and
stopping before the shortest instance runs out. Matcher creation, compilation and the first
(context) row are not timed. The two paths alternate within each repeat, in a seeded balanced
order, so machine noise hits both alike; a warm-up run checks that both fill identical bitmasks.
Reported per row: median per-step times, per-row times, and the decoder / raw ratio as the median
of the per-repeat ratios (paired, so noise cancels); "overhead %" is ``(ratio - 1) * 100`` of
build + rollback against accept + fill + rollback (``add_batch`` is shown apart). Target: at most
10% overhead. Prints a Markdown table; ``--out DIR`` also writes ``bench_decoder.json``.

Run: ``HF_HUB_OFFLINE=1 guidedec bench decoder``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import guidedec
from guidedec import GuidedDecoder, GuidedDecodingConfig, GuidedDecodingParams, GuidedRequest
from guidedec.bench.cases import JSON_CASES as CASES
from guidedec.bench.decoder_raw import RAW_OPS, raw_step
from guidedec.bench.decoder_results import (
    TARGET_OVERHEAD_PCT,
    Samples,
    Times,
    markdown_table,
    summarize,
)
from guidedec.bench.environment import environment
from guidedec.bench.plots import grouped_bars, write_report, write_summary
from guidedec.bench.text import plain
from guidedec.bitmask import allocate_bitmask
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcherFactory

BACKENDS = ("xgrammar", "llguidance")


@dataclass(frozen=True)
class Case:
    """A guide and a valid token sequence under it (no stop token)."""

    params: GuidedDecodingParams
    tokens: list[int]


@dataclass(frozen=True)
class Setting:
    """One table row: a backend, a batch of requests and a speculative-decoding shape."""

    config: GuidedDecodingConfig
    factory: GrammarMatcherFactory
    cases: list[Case]
    batch: int
    drafts: int

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def accepted(self) -> int:
        """Drafts accepted per step: half of them (rounded down) are rejected."""
        return self.drafts // 2

    @property
    def rows(self) -> int:
        return self.batch * (1 + self.drafts)

    def case(self, i: int) -> Case:
        return self.cases[i % len(self.cases)]

    def positions(self) -> list[int]:
        """Index of each step's new token: the new token and its drafts exist in every
        request's instance."""
        shortest = min(len(self.case(i).tokens) for i in range(self.batch))
        return list(range(0, shortest - self.drafts, 1 + self.accepted))


def load_cases(tok: guidedec.TokenizerInfo) -> list[Case]:
    cases = []
    for schema, instance in CASES:
        tokens = tok.encode(json.dumps(instance))
        if set(tokens) & set(tok.stop_token_ids):
            raise ValueError(f"the tokens of {instance!r} contain a stop token")
        cases.append(Case(GuidedDecodingParams(json_schema=schema), tokens))
    return cases


# --- decoder path -------------------------------------------------------------------------------


def make_decoder(setting: Setting) -> GuidedDecoder:
    return GuidedDecoder(
        config=setting.config,
        factory=setting.factory,
        max_num_sequences=setting.batch,
        max_num_draft_tokens=setting.drafts,
    )


def decoder_batches(setting: Setting) -> list[list[GuidedRequest]]:
    """The generation snapshots of every step (built once; the engine's work, not timed)."""
    k = setting.drafts
    batches = []
    for t in setting.positions():
        batch = []
        for i in range(setting.batch):
            case = setting.case(i)
            batch.append(
                GuidedRequest.generation(
                    case.params,
                    request_id=i,
                    seq_slot=i,
                    new_token=case.tokens[t],
                    draft_tokens=case.tokens[t + 1 : t + 1 + k],
                )
            )
        batches.append(batch)
    return batches


def start_decoder(decoder: GuidedDecoder, setting: Setting) -> None:
    """The context step: creates each request's matcher and fills its first row."""
    decoder.add_batch(
        [
            GuidedRequest.context(setting.case(i).params, request_id=i, seq_slot=i)
            for i in range(setting.batch)
        ]
    )
    failures = decoder.build()
    assert failures == [], failures


def decoder_step(
    decoder: GuidedDecoder, batch: list[GuidedRequest], counts: list[int], times: Times
) -> None:
    start = time.perf_counter()
    decoder.add_batch(batch)
    added = time.perf_counter()
    failures = decoder.build()
    built = time.perf_counter()
    if counts:
        failures += decoder.rollback_rejected_batch(counts)
    times.rollback += time.perf_counter() - built
    times.fill += built - added
    times.add += added - start
    assert failures == [], failures


def run_decoder(
    decoder: GuidedDecoder, setting: Setting, batches: list[list[GuidedRequest]]
) -> Times:
    start_decoder(decoder, setting)
    counts = [1 + setting.accepted] * setting.batch if setting.drafts else []
    times = Times()
    for batch in batches:
        decoder_step(decoder, batch, counts, times)
    return times


# --- raw path -----------------------------------------------------------------------------------


def start_raw(setting: Setting, bitmask: torch.Tensor) -> list[Any]:
    """Fresh backend matchers, first row filled (as the decoder's context step does).

    The backend objects are taken from guidedec matchers (the wrappers' private ``_matcher``) so
    that both paths run exactly the same compiled grammar: same tokenizer view, same JSON
    options, same llguidance template, from the same compile cache.
    """
    ops = RAW_OPS[setting.backend]
    matchers = []
    for i in range(setting.batch):
        wrapper: Any = setting.factory.create(setting.case(i).params)
        matcher = wrapper._matcher
        ops.fill(matcher, bitmask, i)
        matchers.append(matcher)
    return matchers


def raw_windows(setting: Setting) -> list[list[list[int]]]:
    """Per step, per request: the new token and the draft tokens."""
    k = setting.drafts
    return [
        [setting.case(i).tokens[t : t + 1 + k] for i in range(setting.batch)]
        for t in setting.positions()
    ]


def run_raw(setting: Setting, bitmask: torch.Tensor, windows: list[list[list[int]]]) -> Times:
    matchers = start_raw(setting, bitmask)
    ops, rollback = RAW_OPS[setting.backend], setting.drafts - setting.accepted
    times = Times()
    for step in windows:
        raw_step(ops, matchers, step, bitmask, rollback, times)
    return times


# --- one row ------------------------------------------------------------------------------------


def check_paths_agree(
    decoder: GuidedDecoder,
    setting: Setting,
    bitmask: torch.Tensor,
    plan: tuple[list[list[GuidedRequest]], list[list[list[int]]]],
) -> None:
    """Warm-up run, in lockstep: both paths must fill identical bitmask rows at every step."""
    batches, windows = plan
    start_decoder(decoder, setting)
    matchers = start_raw(setting, bitmask)
    counts = [1 + setting.accepted] * setting.batch if setting.drafts else []
    ops, scratch = RAW_OPS[setting.backend], Times()
    for batch, window in zip(batches, windows, strict=True):
        decoder_step(decoder, batch, counts, scratch)
        raw_step(ops, matchers, window, bitmask, setting.drafts - setting.accepted, scratch)
        if not torch.equal(decoder.bitmask_host[: setting.rows], bitmask[: setting.rows]):
            raise AssertionError(f"decoder and raw bitmasks differ: {setting}")


def measure(setting: Setting, repeats: int, rng: random.Random) -> Samples:
    """Per-step milliseconds of each repeat; the two paths alternate in a balanced order."""
    decoder = make_decoder(setting)
    bitmask = allocate_bitmask(setting.rows, decoder.vocab_size)
    plan = decoder_batches(setting), raw_windows(setting)
    if not plan[0]:
        raise ValueError(f"the instances are too short for {setting.drafts} draft tokens")
    check_paths_agree(decoder, setting, bitmask, plan)
    runs: dict[str, Callable[[], Times]] = {
        "decoder": lambda: run_decoder(decoder, setting, plan[0]),
        "raw": lambda: run_raw(setting, bitmask, plan[1]),
    }
    firsts = ["decoder", "raw"] * (repeats // 2) + ["decoder"] * (repeats % 2)
    rng.shuffle(firsts)
    samples, steps = Samples(), len(plan[0])
    for first in firsts:
        for name in (first, "raw" if first == "decoder" else "decoder"):
            record(getattr(samples, name), runs[name](), steps)
    return samples


def record(phases: dict[str, list[float]], times: Times, steps: int) -> None:
    """Append one run's per-step milliseconds; "total" is fill (or build) + rollback."""
    times_ms = {
        "add": times.add,
        "fill": times.fill,
        "rollback": times.rollback,
        "total": times.fill + times.rollback,
    }
    for phase, seconds in times_ms.items():
        phases.setdefault(phase, []).append(1e3 * seconds / steps)


# --- main ---------------------------------------------------------------------------------------


def describe(setting: Setting) -> dict[str, Any]:
    """A setting's row fields, as :func:`summarize` reports them."""
    return {
        "backend": setting.backend,
        "batch": setting.batch,
        "drafts": setting.drafts,
        "accepted": setting.accepted,
        "rows_per_step": setting.rows,
        "steps_per_repeat": len(setting.positions()),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--drafts", type=int, nargs="+", default=[0, 4])
    parser.add_argument(
        "--repeats", type=int, default=100, help="timed runs per path and row (a run is S steps)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the order of the two paths")
    parser.add_argument("--out", type=Path, help="directory for bench_decoder.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    tok = guidedec.TokenizerInfo.default()
    cases = load_cases(tok)
    rng = random.Random(args.seed)
    rows = []
    for backend in args.backends:
        # One row at a time, as the raw path: `guidedec bench fill` measures the parallel fills.
        config = GuidedDecodingConfig(backend=backend, tokenizer=tok, fill_mode="sequential")
        factory = create_grammar_matcher_factory(config)
        for batch in args.batches:
            for drafts in args.drafts:
                setting = Setting(config, factory, cases, batch, drafts)
                rows.append(summarize(describe(setting), measure(setting, args.repeats, rng)))
    text = header(args, tok.vocab_size, cases, load) + "\n\n" + markdown_table(rows)
    print(text)
    if args.out is not None:
        write_json(args, cases, load, rows)
        write_summary(args.out, text)
        settings = list(dict.fromkeys((r["batch"], r["drafts"]) for r in rows))
        overhead = {(r["backend"], r["batch"], r["drafts"]): r["overhead_pct"] for r in rows}
        grouped_bars(
            args.out / "bench_decoder.png",
            title="GuidedDecoder build + rollback over the raw backend calls (median)",
            ylabel="overhead %",
            groups=[f"B={b} K={k}" for b, k in settings],
            series={
                backend: [overhead.get((backend, b, k)) for b, k in settings]
                for backend in args.backends
            },
            label_format="%+.1f",
            reference=TARGET_OVERHEAD_PCT,
        )
        print(f"wrote {args.out / 'summary.md'}, {args.out / 'bench_decoder.png'}")


def header(args: argparse.Namespace, vocab: int, cases: list[Case], load: float) -> str:
    lengths = [len(case.tokens) for case in cases]
    return (
        f"vocab: {vocab:,} (default tokenizer); {len(cases)} JSON-schema cases of {lengths} "
        f"tokens; accepted drafts per step: K // 2; repeats: {args.repeats}; load avg: {load:.2f}\n"
        f"target: decoder (build + rollback) at most {TARGET_OVERHEAD_PCT:.0f}% above the raw "
        "backend calls (accept + fill + rollback); ratios are medians of per-repeat pairs"
    )


def write_json(
    args: argparse.Namespace, cases: list[Case], load: float, rows: list[dict[str, Any]]
) -> None:
    report = {
        "argv": sys.argv[1:],
        "vocab_size": guidedec.TokenizerInfo.default().vocab_size,
        "case_token_counts": [len(case.tokens) for case in cases],
        "repeats": args.repeats,
        "seed": args.seed,
        "target_overhead_pct": TARGET_OVERHEAD_PCT,
        **environment(),
        "load_average_at_start": load,
        "rows": rows,
    }
    path = write_report(args.out, "bench_decoder", report)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
