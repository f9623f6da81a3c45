"""``disable_additional_properties``: objects that name their properties take no others, in the
rewrite and in the engine's outputs."""

from __future__ import annotations

import json

import pytest
import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.grammar.closed_objects import close_objects, closed_guide

CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "f"},
        "arguments": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {}}}},
        "extra": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def test_objects_that_name_their_properties_are_closed() -> None:
    closed = close_objects(CALL)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["arguments"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["properties"]["extra"] == CALL["properties"]["extra"]  # said so: kept
    assert "additionalProperties" not in CALL  # the input is not changed
    assert close_objects({"type": "object"}) == {"type": "object"}  # names none: open


@pytest.mark.parametrize(
    "schema",
    [
        {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
        {"properties": {"a": {}}, "unevaluatedProperties": False},
        {"$defs": {"p": {"properties": {"a": {}}}}, "$ref": "#/$defs/p"},
        {"properties": {"a": {}}, "if": {"required": ["a"]}, "then": {"properties": {"b": {}}}},
    ],
)
def test_schemas_whose_objects_combine_are_left_as_they_are(schema: dict) -> None:
    assert close_objects(schema) == schema


def test_the_guide_is_rewritten_and_other_guides_are_kept() -> None:
    guide = GuidedDecodingParams(json_schema=CALL)
    assert json.loads(str(closed_guide(guide).guide)) == close_objects(CALL)
    thinking = closed_guide(GuidedDecodingParams(json_schema=CALL, think_first=True))
    assert thinking.think_first and thinking.answer_opener == "{"
    tag = json.loads(str(thinking.guide))
    assert tag["format"]["elements"][1]["json_schema"] == close_objects(CALL)
    regex = GuidedDecodingParams(regex="a+")
    assert closed_guide(regex) is regex
    open_object = GuidedDecodingParams(json_schema={"type": "object"})
    assert closed_guide(open_object) is open_object


@pytest.mark.parametrize("disable", [True, False, None], ids=["on", "off", "default"])
def test_the_engine_writes_no_unnamed_property_with_the_option(disable: bool | None) -> None:
    """A random model at temperature 1 writes keys of its own into an object that allows them;
    with the option (the default) it writes none."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    option = {} if disable is None else {"disable_additional_properties": disable}
    llm = LLM(
        "tiny-random",
        max_num_seqs=4,
        dtype=torch.float64,
        isolate_compiles=False,
        json_whitespace="compact",
        **option,  # type: ignore[arg-type]
    )
    guide = GuidedDecodingParams(json_schema=schema)
    params = [
        SamplingParams(max_tokens=48, temperature=1.0, seed=seed, guided_decoding=guide)
        for seed in range(8)
    ]
    outputs = llm.generate([f"Object {i}:" for i in range(8)], params)
    llm.close()
    keys = set()
    for out in outputs:
        assert out.complete, out
        keys |= set(json.loads(out.text))
    assert (keys <= {"a"}) is (disable is not False), keys
