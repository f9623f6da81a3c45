"""Exact rewrites for xgrammar: the rewritten schema accepts exactly what the original accepts,
xgrammar enforces it exactly, and the ``auto`` policy sends it to xgrammar."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec.engine.validation import schema_validator
from guidedec.grammar.auto_policy import backend_order, xgrammar_inexact_reason
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.grammar.schema_rewrite import MAX_ALTERNATIVES, rewrite_for_xgrammar

COLORS = ["red", "green", "blue"]
SCHEMAS: dict[str, dict[str, Any]] = {
    "not beside enum": {
        "type": "object",
        "properties": {"color": {"enum": COLORS, "not": {"const": "red"}}},
        "required": ["color"],
        "additionalProperties": False,
    },
    "not enum beside enum": {"type": "string", "enum": COLORS, "not": {"enum": ["red", "blue"]}},
    "unique enum items": {
        "type": "array",
        "items": {"type": "string", "enum": ["a", "b", "c"]},
        "minItems": 1,
        "uniqueItems": True,
    },
    "unique booleans": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
    "dependentRequired": {
        "type": "object",
        "properties": {"card": {"type": "integer"}, "address": {"type": "string"}},
        "dependentRequired": {"card": ["address"]},
        "additionalProperties": False,
    },
    "dependencies list": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "null"}},
        "dependencies": {"a": ["b"], "b": ["c"]},
        "additionalProperties": False,
    },
    "if const then required": {
        "type": "object",
        "properties": {
            "country": {"enum": ["US", "CA", "FR"]},
            "state": {"type": "string"},
            "zip": {"type": "string"},
        },
        "required": ["country"],
        "if": {"properties": {"country": {"const": "US"}}},
        "then": {"required": ["state"]},
        "else": {"required": ["zip"]},
        "additionalProperties": False,
    },
    "if required boolean": {
        "type": "object",
        "properties": {"flag": {"type": "boolean"}, "why": {"type": "string"}},
        "if": {"properties": {"flag": {"const": True}}, "required": ["flag"]},
        "then": {"required": ["why"]},
        "additionalProperties": False,
    },
}
LISTED: dict[str, dict[str, Any]] = {
    "required beside properties": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a", "b"],
    },
    "required beside additionalProperties": {
        "type": "object",
        "required": ["c"],
        "additionalProperties": {"type": "string"},
    },
}
"""Rewritten with ``list_required`` only (the schemas inside structural tags)."""

_VALUES = st.sampled_from([*COLORS, "US", "CA", "FR", "a", "b", "c", "x", 1, True, False, None])
_ARRAYS = st.lists(st.sampled_from(["a", "b", "c", True, False, 2]), max_size=4)
_OBJECTS = st.dictionaries(
    st.sampled_from(
        ["color", "card", "address", "a", "b", "c", "country", "state", "zip", "flag", "why"]
    ),
    st.one_of(_VALUES, st.sampled_from(["", "s"])),
    max_size=4,
)
_INSTANCES = st.one_of(_VALUES, _ARRAYS, _OBJECTS)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_rewrite_is_exact_on_xgrammar(name: str) -> None:
    """Each case is rewritten into constructs xgrammar enforces, so ``auto`` tries it first."""
    text = json.dumps(SCHEMAS[name])
    assert rewrite_for_xgrammar(text) != text
    assert xgrammar_inexact_reason(text) is None
    assert backend_order(GuidedDecodingParams(json_schema=text))[0] == "xgrammar"


@pytest.mark.parametrize("name", sorted({**SCHEMAS, **LISTED}))
@settings(max_examples=300, deadline=None)
@given(instance=_INSTANCES)
def test_rewrite_accepts_what_the_original_accepts(name: str, instance: Any) -> None:
    original = {**SCHEMAS, **LISTED}[name]
    rewritten = json.loads(rewrite_for_xgrammar(json.dumps(original), list_required=True))
    expected = schema_validator(original).is_valid(instance)
    assert schema_validator(rewritten).is_valid(instance) == expected, instance


def test_inexpressible_uses_are_left_alone() -> None:
    """An open object (the trigger cannot be forbidden), a ``not`` beside free strings, an
    ``if`` on a free string, too many sequences: unchanged, and still reported inexact."""
    cases = [
        {"type": "object", "properties": {"a": {}}, "dependentRequired": {"a": ["b"]}},
        {"type": "string", "not": {"const": "x"}},
        {  # a 2020-12 validator ignores ``dependencies``: nothing to restate
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "dependencies": {"a": ["b"]},
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"k": {"type": "string"}},
            "if": {"properties": {"k": {"const": "v"}}},
            "then": {"required": ["k"]},
        },
        {
            "type": "array",
            "items": {"enum": list(range(MAX_ALTERNATIVES))},
            "uniqueItems": True,
        },
    ]
    closed = {"type": "object", "required": ["a"], "additionalProperties": False}
    patterned = {"type": "object", "required": ["a"], "patternProperties": {"^a": {}}}
    for schema in (closed, patterned):  # nothing can have it, or a pattern decides its value
        text = json.dumps(schema)
        assert rewrite_for_xgrammar(text, list_required=True) == text
    for schema in LISTED.values():  # a JSON-schema guide: auto sends it to llguidance first
        text = json.dumps(schema)
        assert rewrite_for_xgrammar(text) == text
        assert rewrite_for_xgrammar(text, list_required=True) != text
    for schema in cases:
        text = json.dumps(schema)
        assert rewrite_for_xgrammar(text) == text
        assert xgrammar_inexact_reason(text) is not None


def test_xgrammar_enforces_the_rewrite(tokenizer: Any) -> None:
    """Through the real xgrammar backend: the values the original forbids are refused."""
    from guidedec.grammar.config import GuidedDecodingConfig
    from guidedec.grammar.xgrammar_backend import XGrammarMatcherFactory

    factory = XGrammarMatcherFactory(GuidedDecodingConfig(backend="xgrammar", tokenizer=tokenizer))
    stop = tokenizer.stop_token_ids[0]

    def accepts(schema: dict[str, Any], text: str) -> bool:
        matcher = factory.create(GuidedDecodingParams(json_schema=schema))
        tokens = tokenizer.hf_tokenizer.encode(text, add_special_tokens=False)
        return all(matcher.accept_token(t) for t in [*tokens, stop])

    cases = [
        ("not beside enum", '{"color": "green"}', '{"color": "red"}'),
        ("unique enum items", '["b", "a"]', '["a", "a"]'),
        ("dependentRequired", '{"card": 1, "address": "x"}', '{"card": 1}'),
        ("if const then required", '{"country": "US", "state": "NY"}', '{"country": "US"}'),
        ("if const then required", '{"country": "FR", "zip": "1"}', '{"country": "FR"}'),
    ]
    for name, valid, invalid in cases:
        assert accepts(SCHEMAS[name], valid), (name, valid)
        assert not accepts(SCHEMAS[name], invalid), (name, invalid)


def test_the_json_schemas_of_a_structural_tag_are_rewritten_too(tokenizer: Any) -> None:
    """A tool call's arguments inside a structural tag get the same rewrites on xgrammar."""
    from guidedec.grammar.config import GuidedDecodingConfig
    from guidedec.grammar.xgrammar_backend import XGrammarMatcherFactory
    from guidedec.testing import accepts_output

    factory = XGrammarMatcherFactory(GuidedDecodingConfig(backend="xgrammar", tokenizer=tokenizer))
    schema = {"type": "object", "properties": {"p": LISTED["required beside properties"]}}
    content = {"type": "json_schema", "json_schema": schema}
    tag = {"type": "tag", "begin": "<call>", "content": content, "end": "</call>"}
    params = GuidedDecodingParams(structural_tag={"type": "structural_tag", "format": tag})
    assert accepts_output(factory, tokenizer, params, '<call>{"p": {"a": 1, "b": 2}}</call>')
    assert not accepts_output(factory, tokenizer, params, '<call>{"p": {"a": 1}}</call>')
