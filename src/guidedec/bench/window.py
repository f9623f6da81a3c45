"""Closing's window sized from each guide's reach, against the fixed 64-token window: outputs
complete within their budget, and host time per token.

Random-logits outputs (each allowed token equally likely, as ``bench compliance`` draws them)
go through the engine's checks (closing, steering, the final schema check) on ``--backend``,
twice per guide: with windows sized from the guides' reach (the default) and with every window
64 tokens, in alternating order. The guides: the first ``--schemas`` schemas of each shared
JSONSchemaBench subset whose window is longer than 64 and that compile, at each of
``--budgets``; and three constructed ones whose outputs can commit to more than 64 tokens (a
property name that owes an array of 100 items, at 90 tokens; thirty arrays of thirty integers,
at 2,048; an EBNF item that owes a hundred tokens, at 90); ``--outputs`` outputs each.
Reported per budget: outputs complete (ended by a stop token or an explicit error, not cut) in
each mode, and the host time per token of the sized windows over the fixed one per guide,
median and geometric mean.

Run: ``HF_HUB_OFFLINE=1 guidedec bench window``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from math import exp, log
from pathlib import Path
from typing import Any

from guidedec.bench.cases import COMMITTING_CASES, COMMITTING_GRAMMARS, SHARED_DATA
from guidedec.bench.closing import SUBSETS
from guidedec.bench.environment import environment
from guidedec.bench.plots import grouped_bars, write_report, write_summary
from guidedec.bench.text import plain
from guidedec.decoder import GuidedDecoder
from guidedec.decoder.closing import WINDOW
from guidedec.errors import GrammarError
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.testing import EngineChecks, make_decoder, uniform_guided_generate
from guidedec.tokenizer import TokenizerInfo

DATA = SHARED_DATA / "jsonschemabench"


def long_window_schemas(
    per_subset: int, factory: GrammarMatcherFactory
) -> list[tuple[str, GuidedDecodingParams]]:
    """The first ``per_subset`` schemas of each subset whose window is over ``WINDOW`` and that
    the factory's backend compiles."""
    decoder: GuidedDecoder = make_decoder(factory=factory, max_num_sequences=1)
    picked = []
    for subset in SUBSETS:
        count = 0
        for index, line in enumerate((DATA / f"{subset}.jsonl").read_text().splitlines()):
            if count >= per_subset:
                break
            row = json.loads(line)
            schema = row.get("schema") or row.get("json_schema")
            text = schema if isinstance(schema, str) else json.dumps(schema)
            params = GuidedDecodingParams(json_schema=text)
            if decoder.closer.window(params) <= WINDOW:
                continue
            try:
                decoder.factory.compile(params)
            except GrammarError:  # a schema the backend refuses is not measured
                continue
            picked.append((f"{subset}#{index}", params))
            count += 1
    return picked


def run_guide(
    params: GuidedDecodingParams,
    budget: int,
    factory: GrammarMatcherFactory,
    sized: bool,
    outputs: int,
) -> tuple[int, int, float]:
    """Outputs complete, tokens, host seconds, for ``outputs`` outputs of one guide."""
    decoder: GuidedDecoder = make_decoder(factory=factory, max_num_sequences=outputs)
    decoder.closer.sized_windows = sized
    decoder.closer.warm_up()
    uniform_guided_generate(decoder, [params], seed=99, max_tokens=4, checks=EngineChecks())
    began = time.perf_counter()
    done = uniform_guided_generate(
        decoder, [params] * outputs, seed=1, max_tokens=budget, checks=EngineChecks()
    )
    seconds = time.perf_counter() - began
    complete = sum(1 for out in done if out.finished or out.error is not None)
    return complete, sum(len(out.token_ids) for out in done), seconds


def measure(
    guides: list[tuple[str, GuidedDecodingParams, int]],
    factory: GrammarMatcherFactory,
    outputs: int,
) -> dict[str, dict[str, Any]]:
    """Per guide and budget: each mode's complete outputs and seconds per token."""
    results: dict[str, dict[str, Any]] = {}
    for index, (name, params, budget) in enumerate(guides):
        row: dict[str, Any] = {"budget": budget, "outputs": outputs}
        order = [True, False] if index % 2 == 0 else [False, True]
        for sized in order:
            complete, tokens, seconds = run_guide(params, budget, factory, sized, outputs)
            mode = "sized" if sized else "fixed"
            row[mode] = {"complete": complete, "per_token_s": seconds / max(1, tokens)}
        results[f"{name} @ {budget}"] = row
    return results


def summary(results: dict[str, dict[str, Any]], backend: str, per_subset: int) -> str:
    outputs = next(iter(results.values()))["outputs"]
    lines = [
        f"random logits, {backend}, engine checks; {outputs} outputs per guide, budget and mode; "
        f"{per_subset} schemas per subset whose window is over {WINDOW} tokens, and the "
        "constructed guides",
        "",
        "| guides | budget | outputs | complete, sized window | complete, 64 | "
        "host time per token, sized / 64: median | geometric mean |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for name, row in results.items():
        guide = name.split(" @ ")[0]
        constructed = guide in COMMITTING_CASES or guide in COMMITTING_GRAMMARS
        kind = guide if constructed else "JSONSchemaBench"
        groups.setdefault((kind, row["budget"]), []).append(row)
    for (kind, budget), rows in groups.items():
        ratios = [r["sized"]["per_token_s"] / r["fixed"]["per_token_s"] for r in rows]
        lines.append(
            f"| {kind} ({len(rows)}) | {budget} | {outputs * len(rows)} "
            f"| {sum(r['sized']['complete'] for r in rows)} "
            f"| {sum(r['fixed']['complete'] for r in rows)} "
            f"| {statistics.median(ratios):.2f}x "
            f"| {exp(sum(log(x) for x in ratios) / len(ratios)):.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--schemas", type=int, default=4, help="schemas per subset")
    parser.add_argument("--budgets", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--outputs", type=int, default=8, help="per guide, budget and mode")
    parser.add_argument("--backend", default="auto", choices=["auto", "xgrammar", "llguidance"])
    parser.add_argument("--out", type=Path, help="directory for bench_window.json")
    args = parser.parse_args(argv)
    config = GuidedDecodingConfig(backend=args.backend, tokenizer=TokenizerInfo.default())
    factory = create_grammar_matcher_factory(config)
    schemas = long_window_schemas(args.schemas, factory)
    guides = [(name, params, b) for b in args.budgets for name, params in schemas]
    guides += [
        (name, GuidedDecodingParams(json_schema=schema), b)
        for name, (schema, b) in COMMITTING_CASES.items()
    ]
    guides += [
        (name, GuidedDecodingParams(ebnf=grammar), b)
        for name, (grammar, b) in COMMITTING_GRAMMARS.items()
    ]
    results = measure(guides, factory, args.outputs)
    text = summary(results, args.backend, args.schemas)
    print(text)
    if args.out is not None:
        report = {"argv": sys.argv[1:], **environment(), "results": results}
        write_report(args.out, "bench_window", report)
        write_summary(args.out, text)
        grouped_bars(
            args.out / "bench_window.png",
            title="random logits: guided outputs complete within max_tokens",
            ylabel="complete %",
            groups=list(results),
            series={
                mode: [100 * row[mode]["complete"] / row["outputs"] for row in results.values()]
                for mode in ("sized", "fixed")
            },
            label_format="%.0f",
        )


if __name__ == "__main__":
    main()
