"""Formats llguidance does not know are annotations: dropped before it compiles, so it enforces
the rest of the schema exactly instead of refusing it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from conftest import DATA, data_params
from guidedec.engine.validation import schema_validator
from guidedec.grammar.auto import LLGUIDANCE, XGRAMMAR, AutoMatcherFactory
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.formats import without_formats
from guidedec.grammar.llguidance_backend import knows_format
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.testing import accepts_output
from guidedec.tokenizer import TokenizerInfo

INT32 = {"type": "integer", "format": "int32"}
BYTE = {"type": "string", "format": "byte"}
EMAIL = {"type": "string", "format": "email"}


def stripped(schema: Any) -> Any:
    return json.loads(without_formats(json.dumps(schema), knows_format))


def test_only_formats_llguidance_does_not_know_are_dropped() -> None:
    assert knows_format("email") and knows_format("date-time")
    assert not knows_format("int32") and not knows_format("byte")
    schema = {
        "$defs": {"blob": BYTE},
        "type": "object",
        "properties": {
            "size": INT32,
            "mail": EMAIL,
            "format": {"type": "string"},  # a property named "format": not a keyword
            "parts": {"type": "array", "items": [INT32], "contains": BYTE},
            "either": {"anyOf": [BYTE, {"not": INT32}]},
            "flag": {"const": {"format": "int32"}, "default": {"format": "byte"}},  # data
        },
        "dependentSchemas": {"size": {"properties": {"unit": BYTE}}},
    }
    plain_int, plain_str = {"type": "integer"}, {"type": "string"}
    assert stripped(schema) == {
        "$defs": {"blob": plain_str},
        "type": "object",
        "properties": {
            "size": plain_int,
            "mail": EMAIL,
            "format": {"type": "string"},
            "parts": {"type": "array", "items": [plain_int], "contains": plain_str},
            "either": {"anyOf": [plain_str, {"not": plain_int}]},
            "flag": {"const": {"format": "int32"}, "default": {"format": "byte"}},
        },
        "dependentSchemas": {"size": {"properties": {"unit": plain_str}}},
    }


@pytest.mark.parametrize("text", ['{"type": "string", "format": "email"}', "{not json", "[1]"])
def test_a_schema_with_nothing_to_drop_is_returned_as_is(text: str) -> None:
    assert without_formats(text, knows_format) is text


def test_llguidance_enforces_a_schema_with_an_unknown_format(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo
) -> None:
    factory = make_factory("llguidance")
    schema = {"type": "object", "properties": {"id": INT32, "mail": EMAIL}, "required": ["id"]}
    params = GuidedDecodingParams(json_schema=schema)
    assert factory.create(params).backend == LLGUIDANCE  # refused before: "Unknown format"

    def accepts(text: str) -> bool:
        return accepts_output(factory, tokenizer, params, text)

    assert accepts('{"id": 7, "mail": "a@b.co"}')
    assert accepts('{"id": 99999999999}')  # int32 is an annotation, as for the check
    assert not accepts('{"id": "7"}')  # the rest of the schema holds
    assert not accepts('{"mail": "a@b.co"}')
    assert not accepts('{"id": 7, "mail": "not an address"}')  # a known format still holds


JSON_SUITE_FORMATS = "json-schema-test-suite/tests/draft2020-12/format.json"


def _format_groups() -> list[Any]:
    path = DATA / JSON_SUITE_FORMATS
    if not path.exists():
        return []
    groups = json.loads(path.read_text())
    unknown = [g for g in groups if not knows_format(g["schema"]["format"])]
    return [pytest.param(g, id=g["schema"]["format"]) for g in unknown]


@pytest.mark.parametrize("group", data_params(_format_groups(), JSON_SUITE_FORMATS))
def test_llguidance_follows_the_test_suite_on_formats(
    group: dict[str, Any],
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
) -> None:
    """The suite's groups of the formats llguidance does not know (annotations: every instance
    is valid, invalid strings included): llguidance compiles each and accepts what jsonschema
    accepts. (Formats it knows it enforces, stricter than the check: see docs/auto-backend.md.)"""
    factory = make_factory("llguidance")
    params = GuidedDecodingParams(json_schema=group["schema"])
    validator = schema_validator(group["schema"])
    for test in group["tests"]:
        valid = validator.is_valid(test["data"])
        assert valid == test["valid"]
        text = json.dumps(test["data"])
        assert accepts_output(factory, tokenizer, params, text) == valid, test["description"]


def test_auto_sends_a_schema_slow_on_xgrammar_with_an_unknown_format_to_llguidance(
    tokenizer: TokenizerInfo,
) -> None:
    """An object open to additional properties with many properties compiles slowly on
    xgrammar; auto tries llguidance first, which used to refuse it for its ``int32``."""
    properties: dict[str, Any] = {f"p{i}": {"type": "string"} for i in range(300)}
    properties["count"] = INT32
    params = GuidedDecodingParams(json_schema={"type": "object", "properties": properties})
    factory = AutoMatcherFactory(GuidedDecodingConfig(backend="auto", tokenizer=tokenizer))
    assert factory.create(params).backend == LLGUIDANCE
    assert factory.chosen_backend(params) == LLGUIDANCE
    assert XGRAMMAR not in factory._factories  # xgrammar was never asked to compile it
