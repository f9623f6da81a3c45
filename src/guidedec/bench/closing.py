"""Budget-aware closing: how many guided outputs end complete and valid within their budget,
with closing on (the default) and off, and what closing costs.

``tiny-random`` samples at temperature 1 (a weak model that rarely closes what it opens), under
JSON schemas from the shared JSONSchemaBench subsets (``--schemas`` per subset, the first ones
that both backends compile) plus regex, EBNF and choice guides, with ``max_tokens`` of 24, 40
and 64 and ``--seeds`` seeds each. Both modes run the same requests in the same engine, their
order alternating per round. Reported per mode: outputs whose grammar completed within the
budget (complete: ``stop``; closed, ``length`` with ``closed_from``, its end chosen by the
budget; or ``grammar_error`` because the engine's check found the output breaks a schema the
backend only approximates), per budget too; complete outputs that validate (``jsonschema`` for
a schema, ``re.fullmatch`` for the regex; the others ended under their grammar), how many of
them closing ended, and those that do not validate (the engine's check should leave none);
outputs cut at ``length``, and those of the cut whose note says no completion fitted; wall
milliseconds per generated token; for closing the search time, searches, forced rows and
redraws. Targets: 100% complete with closing wherever a completion fits the budget; no
complete output that breaks its schema.

Run: ``HF_HUB_OFFLINE=1 guidedec bench closing``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.cases import SHARED_DATA
from guidedec.bench.environment import environment
from guidedec.bench.plots import grouped_bars, write_report, write_summary
from guidedec.bench.text import plain
from guidedec.decoder.closing import ClosingStats
from guidedec.errors import GrammarError

DATA = SHARED_DATA / "jsonschemabench"
SUBSETS = ("Github_easy", "Glaiveai2K", "Kubernetes", "Handwritten", "Synthesized")
BUDGETS = (24, 40, 64)
REGEX = r"[A-Z][a-z]{2,12} (is|was) [0-9]{1,4} (km|m) (north|south)\."
OTHER_GUIDES = {
    "regex": GuidedDecodingParams(regex=REGEX),
    "ebnf": GuidedDecodingParams(
        ebnf='root ::= "(" list ")"\nlist ::= item ("," item)*\nitem ::= [a-z]+ | "(" list ")"'
    ),
    "choice": GuidedDecodingParams(choice=["a short answer", "a much longer answer than that"]),
}


@dataclass
class Tally:
    complete: int = 0  # the grammar complete within the budget: complete, or a schema error
    valid: int = 0  # complete ("stop", or closed by the budget) and valid
    invalid_stop: int = 0  # complete but breaks its schema (must stay 0)
    closed: int = 0  # complete, its end chosen by the budget ("length" with closed_from)
    schema_errors: int = 0  # complete, broke the schema: "grammar_error" naming where
    cut: int = 0
    no_fit: int = 0
    other: int = 0
    tokens: int = 0
    seconds: float = 0.0
    by_budget: dict[int, list[int]] = field(default_factory=dict)  # budget -> [valid, total]


def load_schemas(per_subset: int, llm: LLM) -> list[tuple[str, dict[str, Any]]]:
    """The first ``per_subset`` schemas of each subset that the engine's guide compiles (none
    where the shared data is not checked out next to the project)."""
    chosen: list[tuple[str, dict[str, Any]]] = []
    if not DATA.is_dir():
        return chosen
    for subset in SUBSETS:
        taken = 0
        for line in (DATA / f"{subset}.jsonl").read_text(encoding="utf-8").splitlines():
            if taken >= per_subset:
                break
            schema = json.loads(line)["schema"]
            try:
                llm.factory.create(GuidedDecodingParams(json_schema=schema))
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except (GrammarError, jsonschema.SchemaError, ValueError):
                continue
            chosen.append((f"{subset}:{taken}", schema))
            taken += 1
    return chosen


def requests(
    schemas: list[tuple[str, dict[str, Any]]], seeds: int, close: bool
) -> list[tuple[str, Any, SamplingParams]]:
    guides: list[tuple[str, Any, GuidedDecodingParams]] = [
        (name, schema, GuidedDecodingParams(json_schema=schema)) for name, schema in schemas
    ]
    guides += [(name, None, params) for name, params in OTHER_GUIDES.items()]
    return [
        (
            name,
            schema,
            SamplingParams(
                max_tokens=budget,
                temperature=1.0,
                seed=seed,
                guided_decoding=guide,
                close_within_budget=close,
            ),
        )
        for name, schema, guide in guides
        for budget in BUDGETS
        for seed in range(seeds)
    ]


def is_valid(name: str, schema: Any, text: str) -> bool:
    if schema is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                jsonschema.validate(json.loads(text), schema)
        except (json.JSONDecodeError, jsonschema.ValidationError):
            return False
        return True
    if name == "regex":
        return re.fullmatch(REGEX, text) is not None
    return True  # ended "stop" under its grammar


def run_mode(llm: LLM, batch: list[tuple[str, Any, SamplingParams]], tally: Tally) -> None:
    prompts = [f"Output {i}:" for i in range(len(batch))]
    start = time.perf_counter()
    outputs = llm.generate(prompts, [params for _, _, params in batch])
    tally.seconds += time.perf_counter() - start
    for (name, schema, params), out in zip(batch, outputs, strict=True):
        tally.tokens += len(out.token_ids)
        counts = tally.by_budget.setdefault(params.max_tokens, [0, 0])
        counts[1] += 1
        schema_error = out.finish_reason == "grammar_error" and "breaks its schema" in (
            out.error or ""
        )
        if out.complete or schema_error:
            counts[0] += 1
            tally.complete += 1
        if out.complete:
            valid = is_valid(name, schema, out.text)
            tally.valid += valid
            tally.invalid_stop += not valid
            tally.closed += out.closed_from is not None
        elif schema_error:
            tally.schema_errors += 1
        elif out.finish_reason == "length":
            tally.cut += 1
            tally.no_fit += "no completion" in (out.incomplete or "")
        else:
            tally.other += 1


def _add_difference(total: ClosingStats, after: ClosingStats, before: ClosingStats) -> None:
    """Add to ``total`` what closing did between two snapshots of its counters."""
    for f in dataclasses.fields(ClosingStats):
        setattr(
            total, f.name, getattr(total, f.name) + getattr(after, f.name) - getattr(before, f.name)
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--schemas", type=int, default=4, help="schemas per subset")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="directory for bench_closing.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    llm = LLM("tiny-random", max_num_seqs=32)
    schemas = load_schemas(args.schemas, llm)
    tallies = {"closing": Tally(), "off": Tally()}
    search = ClosingStats()  # over the closing rounds
    for round_index in range(args.rounds):
        order = ["closing", "off"] if round_index % 2 == 0 else ["off", "closing"]
        for mode in order:
            before = dataclasses.replace(llm.decoder.closer.stats)
            run_mode(llm, requests(schemas, args.seeds, mode == "closing"), tallies[mode])
            if mode == "closing":
                _add_difference(search, llm.decoder.closer.stats, before)
    llm.close()
    total = len(requests(schemas, args.seeds, True)) * args.rounds
    text = _summary(args, schemas, tallies, search, total)
    print(text)
    if args.out is not None:
        _write(args.out, text, schemas, tallies, search)


def _summary(
    args: argparse.Namespace,
    schemas: list[tuple[str, Any]],
    tallies: dict[str, Tally],
    search: ClosingStats,
    total: int,
) -> str:
    lines = [
        f"tiny-random, temperature 1; {len(schemas)} JSON schemas ({args.schemas} per subset of "
        f"{', '.join(SUBSETS)}) + regex, EBNF, choice; max_tokens {list(BUDGETS)}; "
        f"{args.seeds} seeds; {args.rounds} rounds; {total} outputs per mode",
        "",
        "| mode | complete | "
        + " | ".join(f"complete at {b}" for b in BUDGETS)
        + " | complete, valid | of which closed | complete, invalid | schema error "
        "| cut (length) | cut, no completion fitted | other | ms per token |",
        "|---|---:|" + "---:|" * len(BUDGETS) + "---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, t in tallies.items():
        per_budget = " | ".join(
            f"{100 * t.by_budget[b][0] / t.by_budget[b][1]:.1f}%" for b in BUDGETS
        )
        lines.append(
            f"| {mode} | {100 * t.complete / total:.1f}% | {per_budget} "
            f"| {100 * t.valid / total:.1f}% | {t.closed} | {t.invalid_stop} | {t.schema_errors} "
            f"| {t.cut} "
            f"| {t.no_fit} | {t.other} | {1e3 * t.seconds / max(1, t.tokens):.3f} |"
        )
    on = tallies["closing"]
    per_token = {m: t.seconds / max(1, t.tokens) for m, t in tallies.items()}
    lines += [
        "",
        f"closing: {search.searches} searches ({search.nodes} states, "
        f"{1e3 * search.search_s:.0f} ms, "
        f"{1e3 * search.search_s / max(1, on.tokens):.3f} ms per generated token), "
        f"{search.forced_rows} forced rows, {search.resampled} redrawn tokens; wall time per token "
        f"closing / off: {per_token['closing'] / per_token['off']:.2f}x",
        f"target: 100% complete with closing wherever a completion fits: {on.complete} of "
        f"{total} ({100 * on.complete / total:.1f}%); {on.no_fit} cut where the search found no "
        f"completion that fits (its completions are short, not always the shortest: such an "
        f"output may have had one)",
        f"target: no complete output breaks its schema: {on.invalid_stop} with closing, "
        f"{tallies['off'].invalid_stop} off; {on.schema_errors} complete outputs broke a schema "
        f"the backend approximates and ended grammar_error naming where",
    ]
    return "\n".join(lines)


def _write(
    out: Path,
    text: str,
    schemas: list[tuple[str, Any]],
    tallies: dict[str, Tally],
    search: ClosingStats,
) -> None:
    report = {
        "argv": sys.argv[1:],
        **environment(),
        "schemas": [name for name, _ in schemas],
        "tallies": {m: t.__dict__ for m, t in tallies.items()},
        "closing": {
            "searches": search.searches,
            "nodes": search.nodes,
            "search_s": search.search_s,
            "forced_rows": search.forced_rows,
            "redrawn": search.resampled,
        },
    }
    write_report(out, "bench_closing", report)
    write_summary(out, text)
    grouped_bars(
        out / "bench_closing.png",
        title="tiny-random, temperature 1: guided outputs complete within max_tokens",
        ylabel="complete (stop) %",
        groups=[f"max_tokens {b}" for b in BUDGETS],
        series={
            mode: [100 * t.by_budget[b][0] / t.by_budget[b][1] for b in BUDGETS]
            for mode, t in tallies.items()
        },
        label_format="%.0f",
    )


if __name__ == "__main__":
    main()
