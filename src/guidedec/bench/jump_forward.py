"""Jump-forward: engine steps, forced tokens and tokens/s with and without ``jump_forward``.

``tiny-random``, greedy, compact JSON whitespace, batch 1 (one request at a time, so that the
steps are one output's), on a schema of long fixed keys and long enum values and on the first
``--schemas`` schemas of each JSONSchemaBench subset of the shared data that the backend
compiles. Two engines with the same weights, one with ``jump_forward=True``, run the same
requests, their order alternating per round; every output must be the same tokens in both
(greedy verification keeps exactly the greedy output). ``auto``, the engine's default (which
gives JSON guides to llguidance first), runs the long-keys schema only. Reported per row: the
share of the output tokens that came as accepted forced drafts, the acceptance of the proposed
ones, the engine steps per output and the tokens/s, on over off. Targets, long-keys row: steps
at most 0.6x, tokens/s at least 1.3x.

Run: ``HF_HUB_OFFLINE=1 guidedec bench jump-forward``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.cases import SHARED_DATA
from guidedec.bench.environment import environment
from guidedec.bench.plots import write_report, write_summary
from guidedec.bench.text import plain
from guidedec.errors import GrammarError

DATA = SHARED_DATA / "jsonschemabench"
SUBSETS = ("Github_easy", "Glaiveai2K", "Kubernetes", "Handwritten", "Synthesized", "MCPspec")
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_full_legal_name": {"type": "string", "maxLength": 12},
        "order_fulfilment_status": {
            "enum": ["approved_by_regional_manager", "rejected_by_finance_department"]
        },
        "shipping_priority_level_code": {"type": "integer", "minimum": 0, "maximum": 9},
        "preferred_delivery_window": {"enum": ["weekday_morning_slot", "weekend_evening_slot"]},
    },
    "required": [
        "customer_full_legal_name",
        "order_fulfilment_status",
        "shipping_priority_level_code",
        "preferred_delivery_window",
    ],
    "additionalProperties": False,
}
TARGET_STEPS = 0.6  # long keys: steps per output, on over off, at most
TARGET_SPEED = 1.3  # long keys: tokens/s, on over off, at least


@dataclass
class Tally:
    """One row: a subset (or the long-keys schema) on one backend, summed over rounds."""

    name: str
    schemas: int = 0
    tokens: int = 0
    steps: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})
    seconds: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    proposed: int = 0
    accepted: int = 0
    same: bool = True

    def row(self) -> dict[str, Any]:
        ratios = [off / on for off, on in zip(self.seconds[False], self.seconds[True], strict=True)]
        return {
            "name": self.name,
            "schemas": self.schemas,
            "tokens": self.tokens,
            "forced_share": self.accepted / self.tokens if self.tokens else 0.0,
            "acceptance": self.accepted / self.proposed if self.proposed else 0.0,
            "steps_ratio": self.steps[True] / self.steps[False] if self.steps[False] else 1.0,
            "speedup": statistics.median(ratios) if ratios else 1.0,
            "same_tokens": self.same,
        }


def load_schemas(per_subset: int, llm: LLM) -> list[tuple[str, dict[str, Any]]]:
    """``(subset, schema)`` for the first ``per_subset`` schemas of each subset that compile."""
    chosen: list[tuple[str, dict[str, Any]]] = []
    if not DATA.is_dir():
        return chosen
    for subset in SUBSETS:
        taken = 0
        path = DATA / f"{subset}.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if taken >= per_subset:
                break
            schema = json.loads(line)["schema"]
            try:
                llm.factory.create(GuidedDecodingParams(json_schema=schema))
            except (GrammarError, ValueError):
                continue
            chosen.append((subset, schema))
            taken += 1
    return chosen


def run_one(
    llm: LLM, prompt: str, params: SamplingParams
) -> tuple[list[int], int, float, int, int]:
    """The output's tokens, the engine steps it took, its seconds, forced tokens proposed and
    accepted."""
    steps, proposed, accepted = (
        llm.stats.steps,
        llm.stats.forced_draft_tokens,
        llm.stats.accepted_forced_tokens,
    )
    start = time.perf_counter()
    [out] = llm.generate([prompt], params)
    seconds = time.perf_counter() - start
    return (
        out.token_ids,
        llm.stats.steps - steps,
        seconds,
        llm.stats.forced_draft_tokens - proposed,
        llm.stats.accepted_forced_tokens - accepted,
    )


def measure(
    engines: dict[bool, LLM],
    cases: list[tuple[str, dict[str, Any]]],
    args: argparse.Namespace,
) -> dict[str, Tally]:
    tallies: dict[str, Tally] = {}
    for name, schema in cases:
        tally = tallies.setdefault(name, Tally(name))
        tally.schemas += 1
        params = SamplingParams(
            max_tokens=args.max_tokens, guided_decoding=GuidedDecodingParams(json_schema=schema)
        )
        for engine in engines.values():  # compile and warm up, not timed
            engine.generate(
                ["Warm-up"], SamplingParams(max_tokens=4, guided_decoding=params.guided_decoding)
            )
        for round_index in range(args.repeats):
            for p in range(args.prompts):
                prompt = f"Record {p}:"
                outputs = {}
                order = (False, True) if (round_index + p) % 2 == 0 else (True, False)
                for jump in order:
                    tokens, steps, seconds, proposed, accepted = run_one(
                        engines[jump], prompt, params
                    )
                    outputs[jump] = tokens
                    tally.steps[jump] += steps
                    tally.seconds[jump].append(seconds / max(1, len(tokens)))
                    if jump:
                        tally.proposed += proposed
                        tally.accepted += accepted
                        tally.tokens += len(tokens)
                tally.same &= outputs[False] == outputs[True]
    return tallies


def markdown(rows: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| backend | guide | schemas | tokens | forced share | acceptance | steps, on / off "
        "| tokens/s, on / off | same tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for backend, backend_rows in rows.items():
        for r in backend_rows:
            lines.append(
                f"| {backend} | {r['name']} | {r['schemas']} | {r['tokens']} | "
                f"{100 * r['forced_share']:.0f}% | {100 * r['acceptance']:.0f}% | "
                f"{r['steps_ratio']:.2f}x | {r['speedup']:.2f}x | "
                f"{'yes' if r['same_tokens'] else 'NO'} |"
            )
    return "\n".join(lines)


def targets(rows: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for backend, backend_rows in rows.items():
        long_keys = next(r for r in backend_rows if r["name"] == "long keys")
        steps_ok = long_keys["steps_ratio"] <= TARGET_STEPS
        speed_ok = long_keys["speedup"] >= TARGET_SPEED
        lines.append(
            f"target ({backend}, long keys): steps <= {TARGET_STEPS}x: "
            f"{long_keys['steps_ratio']:.2f}x {'met' if steps_ok else 'MISSED'}; "
            f"tokens/s >= {TARGET_SPEED}x: {long_keys['speedup']:.2f}x "
            f"{'met' if speed_ok else 'MISSED'}; same tokens: "
            f"{'yes' if all(r['same_tokens'] for r in backend_rows) else 'NO'}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--backends", nargs="+", default=["auto", "llguidance", "xgrammar"])
    parser.add_argument("--schemas", type=int, default=3, help="per subset of the shared data")
    parser.add_argument("--prompts", type=int, default=2, help="requests per schema and round")
    parser.add_argument("--repeats", type=int, default=2, help="rounds")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--num-draft-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, help="directory for bench_jump_forward.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rows: dict[str, list[dict[str, Any]]] = {}
    for backend in args.backends:
        engines = {
            jump: LLM(
                "tiny-random",
                backend=backend,
                max_num_seqs=1,
                json_whitespace="compact",
                jump_forward=jump,
                num_draft_tokens=args.num_draft_tokens,
            )
            for jump in (False, True)
        }
        cases: list[tuple[str, dict[str, Any]]] = [("long keys", LONG_KEYS)]
        if backend != "auto":
            cases += load_schemas(args.schemas, engines[False])
        tallies = measure(engines, cases, args)
        rows[backend] = [t.row() for t in tallies.values()]
        for engine in engines.values():
            engine.close()
    header = (
        f"tiny-random, greedy, compact whitespace, batch 1, max_tokens {args.max_tokens}, "
        f"k = {args.num_draft_tokens}; {args.schemas} schemas per subset, {args.prompts} "
        f"prompts, {args.repeats} rounds; torch threads {torch.get_num_threads()}; "
        f"load avg {load:.2f} at start, {os.getloadavg()[0]:.2f} at end\n"
        "forced share: output tokens that came as accepted forced drafts; acceptance: of the "
        "proposed ones; steps: engine steps per output, on over off; tokens/s: median of "
        "per-output ratios"
    )
    text = f"{header}\n\n{markdown(rows)}\n\n{targets(rows)}"
    print(text)
    if args.out is not None:
        report = {
            "argv": sys.argv[1:],
            **environment(),
            "load_average_at_start": load,
            "rows": rows,
        }
        path = write_report(args.out, "bench_jump_forward", report)
        write_summary(args.out, text)
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
