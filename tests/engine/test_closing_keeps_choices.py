"""Budget-aware closing in the engine forces no row: the model keeps each of its choices after
which a completion fits, and the budget writes only what none of its draws could (a logits
processor, which cannot draw again, forces the witness within ``MARGIN``)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.decoder.closing import MARGIN

RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture
def llm(engine64: LLM) -> LLM:
    return engine64


def _run(llm: LLM, margin: int) -> list[tuple[str, int | None]]:
    llm.decoder.closer.margin = margin
    guide = GuidedDecodingParams(json_schema=RECORD)
    params = [
        SamplingParams(max_tokens=budget, temperature=1.0, seed=seed, guided_decoding=guide)
        for seed in range(3)
        for budget in (14, 20)
    ]
    try:
        outputs = llm.generate([f"Record {i}:" for i in range(len(params))], params)
    finally:
        llm.decoder.closer.margin = 0
    results = []
    for out in outputs:
        assert out.complete, out
        jsonschema.validate(json.loads(out.text), RECORD)
        results.append((out.text, out.closed_from))
    return results


def test_the_engine_forces_no_row_and_keeps_more_of_the_model_s_text(llm: LLM) -> None:
    assert llm.decoder.closer.margin == 0
    before = llm.decoder.closer.stats.forced_rows
    kept = _run(llm, 0)
    assert llm.decoder.closer.stats.forced_rows == before
    forced = _run(llm, MARGIN)
    assert llm.decoder.closer.stats.forced_rows > before
    closed = [(k, f) for k, f in zip(kept, forced, strict=True) if f[1] is not None]
    assert closed  # the budgets are tight enough for closing to act
    model_chars = sum(k[1] if k[1] is not None else len(k[0]) for k, _ in closed)
    assert model_chars > sum(f[1] or 0 for _, f in closed)
