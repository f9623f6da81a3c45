"""``GuidedDecodingParams(think_first=True)``: free text, then the JSON value the guide holds;
the engine returns the text as ``reasoning`` and the value as ``text``."""

from __future__ import annotations

import json

import jsonschema
import pytest

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.grammar.params import GuideType

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
CALLS = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}


def test_think_first_is_a_structural_tag_of_free_text_then_the_value() -> None:
    params = GuidedDecodingParams(json_schema=PERSON, think_first=True)
    assert params.guide_type is GuideType.STRUCTURAL_TAG
    assert params.answer_opener == "{"
    tag = json.loads(str(params.guide))
    free, value = tag["format"]["elements"]
    assert free == {"type": "regex", "pattern": "[^{]*"}
    assert value == {"type": "json_schema", "json_schema": PERSON}
    assert GuidedDecodingParams(json_schema=CALLS, think_first=True).answer_opener == "["
    assert GuidedDecodingParams(json_object=True, think_first=True).answer_opener == "{"
    assert GuidedDecodingParams(json_schema=PERSON).answer_opener is None
    assert params != GuidedDecodingParams(json_schema=PERSON)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"regex": "[0-9]+"}, "think_first goes with json_schema or json_object, not regex"),
        ({"json_schema": {"type": "string"}}, "an object or an array"),
        ({"json_schema": {"properties": {}}}, "got type None"),
        ({"json_schema": "{not json"}, "json_schema is not JSON"),
    ],
)
def test_think_first_with_another_guide_or_value_is_refused(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        GuidedDecodingParams(**fields, think_first=True)  # type: ignore[arg-type]


@pytest.fixture
def llm(engine64: LLM) -> LLM:
    return engine64


@pytest.mark.parametrize("schema", [PERSON, CALLS], ids=["object", "array"])
def test_the_value_is_text_and_the_free_text_reasoning(llm: LLM, schema: dict) -> None:
    """Sampled outputs of a random model within tight budgets: every one ends with a valid
    value (closing reaches it), the free text holds no opener, and the two make the output."""
    guide = GuidedDecodingParams(json_schema=schema, think_first=True)
    opener = guide.answer_opener
    params = [
        SamplingParams(max_tokens=budget, temperature=1.0, seed=seed, guided_decoding=guide)
        for seed, budget in enumerate([24, 32, 48, 64, 24, 40])
    ]
    outputs = llm.generate([f"Think, then answer {i}:" for i in range(6)], params)
    thought = 0
    for out in outputs:
        assert out.complete, out
        jsonschema.validate(json.loads(out.text), schema)
        assert out.text.startswith(str(opener))
        reasoning = out.reasoning or ""
        assert str(opener) not in reasoning
        assert reasoning + out.text == llm.tokenizer.decode(list(out.token_ids))
        thought += bool(reasoning)
    assert thought > 0  # a random model writes free text before it is made to answer
