"""``guidedec bench closing`` counts an output the budget closed (``length`` with
``closed_from``) as complete, and judges it as it judges one that stopped by itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.closing import Tally, run_mode

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "note": {"type": "string"}},
    "required": ["name", "note"],
}


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    engine = LLM("tiny-random", max_num_seqs=8, isolate_compiles=False)
    yield engine
    engine.close()


def test_closed_outputs_count_as_complete(llm: LLM) -> None:
    guide = GuidedDecodingParams(json_schema=SCHEMA)
    params = [
        SamplingParams(max_tokens=16, temperature=1.0, seed=seed, guided_decoding=guide)
        for seed in range(8)
    ]
    on, off = Tally(), Tally()
    run_mode(llm, [("schema", SCHEMA, p) for p in params], on)
    cut = [dataclasses.replace(p, close_within_budget=False) for p in params]
    run_mode(llm, [("schema", SCHEMA, p) for p in cut], off)
    assert on.complete == on.valid == 8 and on.cut == 0 and on.invalid_stop == 0
    assert on.closed > 0  # a random model runs past 16 tokens: the budget ends its outputs
    assert off.cut > 0 and off.closed == 0 and off.complete == off.valid == 8 - off.cut
    assert on.by_budget == {16: [8, 8]}
