"""One set of rules for every row: greedy outputs in float64 are the same token for token on every
engine path (plain, n-gram, a draft model, jump-forward alone and with n-grams, overlap off,
the static CUDA-graph path), for JSON-schema, regex, EBNF and choice guides on both backends,
with budget-aware closing acting (tight budgets) and the runaway-digit rule acting (a weak model
writes an integer's digits until the rule cuts them)."""

from __future__ import annotations

from typing import Any

import pytest

from guidedec import LLM, GuidedDecodingParams, SamplingParams

RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 30},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
    },
    "required": ["id", "name", "tags"],
}
GUIDES = {
    "json_schema": GuidedDecodingParams(json_schema=RECORD),
    "regex": GuidedDecodingParams(regex="[a-z]{2,12}(, [a-z]{2,12}){0,4}\\."),
    "ebnf": GuidedDecodingParams(ebnf='root ::= "(" item ("," item)* ")"\nitem ::= [a-c]+'),
    "choice": GuidedDecodingParams(choice=["north", "south west", "east by north east"]),
}
# (prompt, guide, max_tokens, closing): the digit rule acts on the first two (greedy
# tiny-random writes `904` over and over as the record's id), closing on the tight budgets.
REQUESTS = [
    ("Record one:", "json_schema", 120, True),
    ("Record two is here:", "json_schema", 120, True),
    ("A short record:", "json_schema", 24, True),
    ("Words:", "regex", 48, False),
    ("More words:", "regex", 12, True),
    ("Items:", "ebnf", 40, False),
    ("Tight items:", "ebnf", 10, True),
    ("Way:", "choice", 12, True),
]
PATHS: dict[str, dict[str, Any]] = {
    "plain": {"jump_forward": False},
    "overlap off": {"jump_forward": False, "overlap": False},
    "ngram": {"jump_forward": False, "speculative": "ngram"},
    "draft model": {"speculative": "draft:tiny-random-draft"},
    "jump-forward": {"jump_forward": True},
    "jump-forward + ngram": {"jump_forward": True, "speculative": "ngram"},
    "static graph path": {"cuda_graphs": True},
}
SPECULATIVE = ("ngram", "draft model", "jump-forward", "jump-forward + ngram")


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=budget, guided_decoding=GUIDES[guide], close_within_budget=close)
        for _, guide, budget, close in REQUESTS
    ]


def _run(backend: str, options: dict[str, Any]) -> tuple[list[Any], LLM]:
    llm = LLM(
        "tiny-random",
        backend=backend,  # type: ignore[arg-type]
        dtype="float64",
        max_num_seqs=len(REQUESTS),
        num_draft_tokens=4,
        isolate_compiles=False,
        **options,
    )
    outputs = llm.generate([prompt for prompt, *_ in REQUESTS], _params())
    llm.close()
    return [(o.token_ids, o.finish_reason, o.error) for o in outputs], llm


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_every_engine_path_gives_the_plain_greedy_outputs(backend: str) -> None:
    plain, llm = _run(backend, PATHS["plain"])
    # The matrix proves something only where the rules act: closing refused sampled tokens
    # (the engine forces no row: it draws again) and the digit rule cut a run, and every
    # output ended as its guide allows.
    assert llm.decoder.rules.stats.digit_runs_cut > 0
    assert llm.decoder.closer.stats.resampled > 0
    assert all(reason in ("stop", "length") and error is None for _, reason, error in plain)
    for name, options in PATHS.items():
        if name == "plain":
            continue
        outputs, engine = _run(backend, options)
        for request, got, expected in zip(REQUESTS, outputs, plain, strict=True):
            assert got == expected, (name, request)
        if name in SPECULATIVE:
            assert engine.stats.accepted_draft_tokens > 0, name
