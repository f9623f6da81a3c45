"""OpenAI structured-output fields to guides, and constrained tool-call output to tool_calls."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from guidedec import GrammarMatcherFactory, GuidedDecodingParams, TokenizerInfo
from guidedec.server.structured import (
    RequestError,
    guide_for_request,
    parse_tool_calls,
    required_calls_schema,
    tool_choice_constrains,
)
from guidedec.testing import accepts_output

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "now", "description": "The time."}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, GuidedDecodingParams(json_object=True)),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            GuidedDecodingParams(json_schema=SCHEMA),
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "strict": True, "schema": SCHEMA},
                }
            },
            GuidedDecodingParams(json_schema=SCHEMA),
        ),
        ({"structured_outputs": {"json": SCHEMA}}, GuidedDecodingParams(json_schema=SCHEMA)),
        (
            {"structured_outputs": {"json": json.dumps(SCHEMA)}},
            GuidedDecodingParams(json_schema=json.dumps(SCHEMA)),
        ),
        ({"structured_outputs": {"regex": "a+"}}, GuidedDecodingParams(regex="a+")),
        ({"structured_outputs": {"choice": ["x", "y"]}}, GuidedDecodingParams(choice=["x", "y"])),
        (
            {"structured_outputs": {"grammar": 'root ::= "a"'}},
            GuidedDecodingParams(ebnf='root ::= "a"'),
        ),
        ({"structured_outputs": {"lark": 'start: "a"'}}, GuidedDecodingParams(lark='start: "a"')),
        (
            {"structured_outputs": {"structural_tag": {"type": "x"}}},
            GuidedDecodingParams(structural_tag={"type": "x"}),
        ),
        ({"structured_outputs": {"json_object": True}}, GuidedDecodingParams(json_object=True)),
        (
            {"structured_outputs": {"regex": "a", "choice": None, "json_object": False}},
            GuidedDecodingParams(regex="a"),
        ),
        ({"tools": TOOLS}, None),
        ({"tools": TOOLS, "tool_choice": "auto"}, None),
        ({"tools": TOOLS, "tool_choice": "none"}, None),
        ({"tool_choice": "none"}, None),
        (
            {"tools": TOOLS, "tool_choice": "auto", "response_format": {"type": "json_object"}},
            GuidedDecodingParams(json_object=True),
        ),
        (
            {"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "text"}},
            GuidedDecodingParams(json_schema=WEATHER),
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": None}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            GuidedDecodingParams(json_schema={"type": "object"}),
        ),
        ({"tools": TOOLS, "tool_choice": NAMED}, GuidedDecodingParams(json_schema=WEATHER)),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "now"}}},
            GuidedDecodingParams(json_schema={"type": "object"}),
        ),
        (
            {"response_format": {"type": "text"}, "structured_outputs": {"regex": "a"}},
            GuidedDecodingParams(regex="a"),
        ),
    ],
)
def test_each_field_maps_to_its_guide(
    kwargs: dict[str, Any], expected: GuidedDecodingParams | None
) -> None:
    got = guide_for_request(**kwargs)
    assert got == expected
    if expected is not None:
        assert got is not None and got.guide_type is expected.guide_type


def test_required_builds_an_array_of_calls_schema() -> None:
    guide = guide_for_request(tools=TOOLS, tool_choice="required")
    assert guide is not None
    schema = json.loads(str(guide.guide))
    assert schema["type"] == "array" and schema["minItems"] == 1
    items = schema["items"]["anyOf"]
    assert [i["properties"]["name"] for i in items] == [{"const": "get_weather"}, {"const": "now"}]
    assert [i["properties"]["arguments"] for i in items] == [WEATHER, {"type": "object"}]
    assert all(i["additionalProperties"] is False for i in items)
    assert all(i["required"] == ["name", "arguments"] for i in items)


BAD_REQUESTS = [
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "'yaml'"),
    ({"response_format": {}}, "response_format.type", "response_format.type must be"),
    (
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "response_format.json_schema must be an object",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
        "response_format.json_schema.schema",
        "response_format.json_schema.schema must be an object",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": "{}"}}},
        "response_format.json_schema.schema",
        "must be an object",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}},
        "response_format.json_schema.name",
        "name must be a string",
    ),
    ({"structured_outputs": []}, "structured_outputs", "must be an object"),
    ({"structured_outputs": {}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "['regex'"),
    ({"structured_outputs": {"pattern": "a"}}, "structured_outputs.pattern", "is not one of"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty list"),
    ({"structured_outputs": {"choice": "ab"}}, "structured_outputs.choice", "list of strings"),
    ({"structured_outputs": {"choice": ["a", 1]}}, "structured_outputs.choice", "strings"),
    ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex", "must be a string"),
    ({"structured_outputs": {"grammar": {}}}, "structured_outputs.grammar", "must be a string"),
    ({"structured_outputs": {"lark": ["x"]}}, "structured_outputs.lark", "must be a string"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "not valid JSON"),
    ({"structured_outputs": {"json": "[1]"}}, "structured_outputs.json", "must be an object"),
    ({"structured_outputs": {"json": 7}}, "structured_outputs.json", "must be an object"),
    (
        {"structured_outputs": {"structural_tag": "nope"}},
        "structured_outputs.structural_tag",
        "not valid JSON",
    ),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object", "true"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "structured_outputs",
        "response_format and structured_outputs",
    ),
    ({"tools": {"name": "f"}}, "tools", "tools must be a list"),
    ({"tools": "f"}, "tools", "tools must be a list"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "type 'function'"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "tools[0].function must be"),
    (
        {"tools": [*TOOLS, {"type": "function", "function": {"description": "x"}}]},
        "tools[2].function.name",
        "tools[2].function.name must be a non-empty string",
    ),
    (
        {"tools": [*TOOLS, {"type": "function", "function": {"name": "now"}}]},
        "tools[2].function.name",
        "'now' is a duplicate",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
        "tools[0].function.parameters",
        "parameters must be an object",
    ),
    ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "'required'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice", "tool_choice must"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
        "tool_choice.function.name",
        "'x' is not one of the tools ['get_weather', 'now']",
    ),
    (
        {"tool_choice": NAMED},
        "tool_choice.function.name",
        "'get_weather' is not one of the tools []",
    ),
    (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
        "response_format and tool_choice",
    ),
    (
        {"tools": TOOLS, "tool_choice": NAMED, "structured_outputs": {"regex": "a"}},
        "tool_choice",
        "structured_outputs and tool_choice",
    ),
]


@pytest.mark.parametrize(("kwargs", "param", "message"), BAD_REQUESTS)
def test_bad_fields_raise_request_error_naming_the_field(
    kwargs: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(RequestError) as info:
        guide_for_request(**kwargs)
    assert info.value.param == param
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
TOOL_OUTPUTS = [
    # (tool_choice, valid output, invalid output)
    ("required", json.dumps([CALL]), json.dumps([])),
    ("required", json.dumps([CALL, {"name": "now", "arguments": {}}]), json.dumps(CALL)),
    ("required", json.dumps([CALL]), json.dumps([{**CALL, "name": "get_weathe"}])),
    ("required", json.dumps([CALL]), json.dumps([{**CALL, "arguments": {"city": "Paris"}}])),
    ("required", json.dumps([CALL]), json.dumps([{**CALL, "id": 1}])),
    (NAMED, json.dumps(CALL["arguments"]), json.dumps(CALL)),
    (NAMED, '{"city": "Oslo", "unit": "f"}', '{"city": "Oslo", "unit": "k"}'),
]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize(("tool_choice", "valid", "invalid"), TOOL_OUTPUTS)
def test_tool_guides_compile_and_enforce_the_call_format(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    backend: str,
    tool_choice: Any,
    valid: str,
    invalid: str,
) -> None:
    guide = guide_for_request(tools=TOOLS, tool_choice=tool_choice)
    assert guide is not None
    factory = make_factory(backend)
    assert accepts_output(factory, tokenizer, guide, valid)
    assert not accepts_output(factory, tokenizer, guide, invalid)
    assert parse_tool_calls(valid, tools=TOOLS, tool_choice=tool_choice)


NODE = {
    "type": "object",
    "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
    "required": ["v", "next"],
    "additionalProperties": False,
}
POINT = {
    "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
    "type": "object",
    "properties": {"p": {"$ref": "#/$defs/P"}, "q": {"$ref": "#/definitions/Q"}},
    "definitions": {"Q": {"enum": [1, 2]}},
    "required": ["p", "q"],
}
POINT_ARGS = {"p": {"x": 1}, "q": 2}


def test_required_schema_moves_local_refs_to_the_root() -> None:
    schema = required_calls_schema({"list": NODE, "point": POINT})
    assert set(schema["$defs"]) == {"tool0", "tool1__P", "tool1__Q"}
    node_args = schema["items"]["anyOf"][0]["properties"]["arguments"]
    assert node_args == {"$ref": "#/$defs/tool0"}
    assert schema["$defs"]["tool0"]["properties"]["next"]["anyOf"][0] == {"$ref": "#/$defs/tool0"}
    point_args = schema["items"]["anyOf"][1]["properties"]["arguments"]
    assert point_args["properties"] == {
        "p": {"$ref": "#/$defs/tool1__P"},
        "q": {"$ref": "#/$defs/tool1__Q"},
    }
    assert "$defs" not in point_args and "definitions" not in point_args


def test_required_schema_hoists_a_tool_whose_definitions_refer_to_its_root() -> None:
    tree = {"$defs": {"Kids": {"type": "array", "items": {"$ref": "#"}}}, "type": "object"}
    tree["properties"] = {"kids": {"$ref": "#/$defs/Kids"}}
    schema = required_calls_schema({"tree": tree})
    assert schema["items"]["anyOf"][0]["properties"]["arguments"] == {"$ref": "#/$defs/tool0"}
    assert schema["$defs"]["tool0__Kids"]["items"] == {"$ref": "#/$defs/tool0"}
    assert schema["$defs"]["tool0"]["properties"]["kids"] == {"$ref": "#/$defs/tool0__Kids"}


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_required_schema_with_refs_compiles_and_resolves(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo, backend: str
) -> None:
    tools = [
        {"type": "function", "function": {"name": "list", "parameters": NODE}},
        {"type": "function", "function": {"name": "point", "parameters": POINT}},
    ]
    guide = guide_for_request(tools=tools, tool_choice="required")
    assert guide is not None
    factory = make_factory(backend)
    linked = {"v": 1, "next": {"v": 2, "next": None}}
    valid = [{"name": "list", "arguments": linked}, {"name": "point", "arguments": POINT_ARGS}]
    assert accepts_output(factory, tokenizer, guide, json.dumps(valid))
    bad_q = [{"name": "point", "arguments": {"p": {"x": 1}, "q": 3}}]
    assert not accepts_output(factory, tokenizer, guide, json.dumps(bad_q))
    bad_node = [{"name": "list", "arguments": {"v": 1, "next": {"v": "2", "next": None}}}]
    assert not accepts_output(factory, tokenizer, guide, json.dumps(bad_node))


def test_parse_required_tool_calls_round_trips() -> None:
    calls = [CALL, {"name": "now", "arguments": {}}, CALL]
    parsed = parse_tool_calls("\n " + json.dumps(calls), tools=TOOLS, tool_choice="required")
    assert [c["function"]["name"] for c in parsed] == ["get_weather", "now", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in parsed] == [
        c["arguments"] for c in calls
    ]
    assert all(isinstance(c["function"]["arguments"], str) for c in parsed)
    assert all(c["type"] == "function" for c in parsed)
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) for c in parsed)
    assert len({c["id"] for c in parsed}) == 3


def test_parse_named_tool_call_wraps_the_arguments_object() -> None:
    args = {"city": "Zürich", "unit": "c"}
    (call,) = parse_tool_calls(json.dumps(args), tools=TOOLS, tool_choice=NAMED)
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == args
    assert "Zürich" in call["function"]["arguments"]


@pytest.mark.parametrize("tool_choice", ["none", "auto"])
def test_unconstrained_tool_choice_parses_no_calls(tool_choice: str) -> None:
    assert parse_tool_calls("Hello!", tools=TOOLS, tool_choice=tool_choice) == []
    assert not tool_choice_constrains(tool_choice)
    assert not tool_choice_constrains(None)
    assert tool_choice_constrains("required") and tool_choice_constrains(NAMED)


@pytest.mark.parametrize(
    ("text", "tool_choice", "message"),
    [
        (json.dumps([CALL])[:-5], "required", "not complete JSON"),
        ("", "required", "not complete JSON"),
        ("[]", "required", "non-empty JSON array"),
        (json.dumps(CALL), "required", "non-empty JSON array"),
        (json.dumps([{**CALL, "name": "nope"}]), "required", "does not name one of the tools"),
        (json.dumps([{"name": "now", "arguments": [1]}]), "required", "must be a JSON object"),
        ('{"city": "Pa', NAMED, "not complete JSON"),
        ("[1]", NAMED, "must be a JSON object"),
    ],
)
def test_parse_tool_calls_raises_on_bad_output(text: str, tool_choice: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_tool_calls(text, tools=TOOLS, tool_choice=tool_choice)


def test_parse_tool_calls_validates_the_request_too() -> None:
    bad = {"type": "function", "function": {"name": "x"}}
    with pytest.raises(RequestError, match="not one of the tools"):
        parse_tool_calls("{}", tools=TOOLS, tool_choice=bad)
