"""Hostile guides beside a healthy request: what each gets, how fast, and what memory is left.

Each category is a guide that crashed a backend, hung it or ate memory before guidedec's compile
isolation and guide limits (see :mod:`guidedec.grammar.isolation` and
:mod:`guidedec.grammar.limits`). One ``LLM`` (``tiny-random``, defaults, ``compile_timeout_s``
of ``--timeout``) runs, per category, the hostile request and a healthy JSON-schema request in
the same ``generate`` call; the healthy request alone comes first, run three times, and the
median of its times is the baseline (every time by the engine's clock, arrival to end). Reported
per category: the hostile request's outcome (finish reason and the head of its error), its time to
answer, the healthy request's time beside it over its time alone, and the process's RSS after.
Targets: no crash, no answer later than the timeout + 1 s, the healthy request at most 1.5x its
time alone, RSS after the suite within 500 MB of before it. The guides that crash or hang a
backend run again with the limits lifted, so that compile isolation alone stands in front of
the backend.

Run: ``HF_HUB_OFFLINE=1 guidedec bench robustness``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from guidedec import LLM, GuidedDecodingParams, RequestOutput, SamplingParams
from guidedec.bench.environment import environment
from guidedec.bench.plots import write_report, write_summary
from guidedec.bench.text import plain
from guidedec.grammar.limits import GuideLimits

HEALTHY = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def categories() -> dict[str, GuidedDecodingParams]:
    """The hostile guides, each named by what it did before."""
    chain = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(3000)}
    return {
        "xgrammar crash: 30,000 nested groups": GuidedDecodingParams(
            json_schema={"type": "string", "pattern": "^" + "(" * 30000 + "a" + ")" * 30000 + "$"}
        ),
        "llguidance crash: 30,000 required": GuidedDecodingParams(
            json_schema={"type": "object", "required": [f"k{i}" for i in range(30000)]}
        ),
        "llguidance crash: $ref chain of 3,000": GuidedDecodingParams(
            json_schema={"$ref": "#/$defs/d0", "$defs": {**chain, "d3000": {"type": "integer"}}}
        ),
        "hang: 100,000 choices": GuidedDecodingParams(
            choice=[f"option number {i}" for i in range(100_000)]
        ),
        "hang: 12,000 choices (under the limit)": GuidedDecodingParams(
            choice=[f"a fairly long option number {i}" for i in range(12_000)]
        ),
        "memory: 100,000-value enum": GuidedDecodingParams(
            json_schema={"enum": [f"value {i}" for i in range(100_000)]}
        ),
        "memory: nested lark repetition": GuidedDecodingParams(lark="start: /((a{100}){100}){7}/"),
        "slow masks: lark /(a{700}){700}/": GuidedDecodingParams(lark="start: /(a{700}){700}/"),
        "wrong value: integer minimum 2**63": GuidedDecodingParams(
            json_schema={"type": "integer", "minimum": 2**63, "maximum": 2**63 + 10}
        ),
        "external $ref": GuidedDecodingParams(json_schema={"$ref": "http://example.com/s.json"}),
        "deep nesting: 400 levels": GuidedDecodingParams(json_schema=_deep(400)),
        "ebnf: 20,000 rules": GuidedDecodingParams(
            ebnf="root ::= r0\n" + "".join(f'r{i} ::= "x"\n' for i in range(20_000))
        ),
    }


def _deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        node = {"type": "array", "items": node}
    return node


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


ALONE_RUNS = 3
"""Runs of the healthy request alone per category; the baseline is their median time (one run
is a short request that a busy moment of the machine moves by half)."""


def healthy_params(seed: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=48,
        temperature=1.0,
        seed=seed,
        guided_decoding=GuidedDecodingParams(json_schema=HEALTHY),
    )


def run(
    llm: LLM, guides: dict[str, GuidedDecodingParams]
) -> tuple[list[str], list[dict[str, Any]]]:
    """Each hostile guide beside a healthy request (after the healthy one alone)."""
    rows: list[str] = []
    records: list[dict[str, Any]] = []
    for i, (name, guide) in enumerate(guides.items()):
        runs = [llm.generate(["A person:"], [healthy_params(i + 1)])[0] for _ in range(ALONE_RUNS)]
        alone_s = statistics.median(_took(run) for run in runs)
        pair = [SamplingParams(max_tokens=16, guided_decoding=guide), healthy_params(i + 1)]
        hostile, beside = llm.generate(["Oops:", "A person:"], pair)
        hostile_s, beside_s = _took(hostile), _took(beside)
        same = all(run.token_ids == beside.token_ids for run in runs)
        outcome = hostile.finish_reason + (f": {hostile.error[:90]}" if hostile.error else "")
        record = {
            "category": name,
            "outcome": outcome,
            "hostile_s": hostile_s,
            "healthy_alone_s": alone_s,
            "healthy_beside_s": beside_s,
            "healthy_ratio": beside_s / alone_s,
            "healthy_unchanged": same,
            "rss_mb": rss_mb(),
        }
        records.append(record)
        rows.append(
            f"| {name} | {outcome.replace('|', '/')} | {hostile_s:.2f} | "
            f"{beside_s / alone_s:.2f}x | {'yes' if same else 'NO'} | {record['rss_mb']:.0f} |"
        )
        print(rows[-1], file=sys.stderr)
    return rows, records


def _took(output: RequestOutput) -> float:
    """Seconds from the request's arrival to its end, by the engine's own clock."""
    return output.metrics.finished - output.metrics.arrival  # type: ignore[operator]


HEADER = [
    "| category | hostile request's outcome | its answer s | healthy beside / alone "
    "| healthy output unchanged | RSS MB after |",
    "|---|---|---:|---:|---|---:|",
]
LIFTED = GuideLimits(**{f.name: 10**9 for f in fields(GuideLimits)})
"""No limit: what compile isolation alone does with the guides the limits would refuse."""
ISOLATION_ONLY = (
    "xgrammar crash: 30,000 nested groups",
    "llguidance crash: 30,000 required",
    "llguidance crash: $ref chain of 3,000",
    "hang: 100,000 choices",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--timeout", type=float, default=10.0, help="compile_timeout_s")
    parser.add_argument("--out", type=Path, help="directory for bench_robustness.json")
    args = parser.parse_args(argv)
    guides = categories()
    llm = LLM("tiny-random", max_num_seqs=4, compile_timeout_s=args.timeout)
    llm.generate(["Warm up:"], [healthy_params(0)])
    rss_before = rss_mb()
    rows, records = run(llm, guides)
    llm.close()
    lifted = LLM("tiny-random", max_num_seqs=4, compile_timeout_s=args.timeout, guide_limits=LIFTED)
    lifted_rows, lifted_records = run(lifted, {k: guides[k] for k in ISOLATION_ONLY})
    lifted.close()
    rss_after = rss_mb()
    everything = records + lifted_records
    late = [r for r in everything if r["hostile_s"] > args.timeout + 1]
    slow = [r for r in everything if r["healthy_ratio"] > 1.5]
    text = "\n".join(
        [
            f"tiny-random, compile_timeout_s={args.timeout:g}; each hostile request beside a "
            "healthy JSON-schema request (48 tokens, temperature 1) in one generate call; "
            f"healthy alone: the median of {ALONE_RUNS} runs; times from arrival to end",
            "",
            "Defaults (guide limits and compile isolation):",
            "",
            *HEADER,
            *rows,
            "",
            "The limits lifted (`guide_limits` with every limit at 10**9): compile isolation "
            "alone between the guide and the backend:",
            "",
            *HEADER,
            *lifted_rows,
            "",
            f"RSS {rss_before:.0f} MB before the suite, {rss_after:.0f} MB after "
            f"({rss_after - rss_before:+.0f} MB; target within 500 MB)",
            f"target: no answer later than the timeout + 1 s: {len(late)} late; "
            f"healthy request at most 1.5x alone: {len(slow)} slower"
            + (f" ({', '.join(r['category'] for r in slow)})" if slow else ""),
        ]
    )
    print(text)
    if args.out is not None:
        report: dict[str, Any] = {"environment": environment(), "records": records}
        report |= {"isolation_only": lifted_records}
        report |= {"rss_before_mb": rss_before, "rss_after_mb": rss_after}
        write_report(args.out, "bench_robustness", report)
        write_summary(args.out, text)


if __name__ == "__main__":
    main()
