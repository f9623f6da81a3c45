"""Guide limits: hostile sizes and shapes are refused with an error that names the limit, in
linear time, before a backend sees them; the real schemas of the shared data all pass."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from conftest import DATA as SHARED_DATA
from conftest import missing_data
from guidedec import GuidedDecodingParams
from guidedec.errors import GrammarError
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.limits import GuideLimits
from guidedec.tokenizer import TokenizerInfo

DATA = SHARED_DATA / "jsonschemabench"

HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "nested groups": (
        {"type": "string", "pattern": "^" + "(" * 300 + "a" + ")" * 300 + "$"},
        "nests 300 groups",
    ),
    "long pattern": ({"type": "string", "pattern": "a" * 20000}, "max_pattern_chars"),
    "pattern property": (
        {"type": "object", "patternProperties": {"(" * 200 + ")" * 200: {}}},
        "patternProperties pattern",
    ),
    "30k required": (
        {"type": "object", "required": [f"k{i}" for i in range(30000)]},
        "30000 required names",
    ),
    "100k enum": ({"enum": list(range(100_000))}, "enum of 100000 values"),
    "ref chain": (
        {
            "$ref": "#/$defs/d0",
            "$defs": {
                **{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(3000)},
                "d3000": {"type": "integer"},
            },
        },
        "longer than 512 links",
    ),
    "ref loop": ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, "itself"),
    "external ref": ({"$ref": "http://example.com/schema.json"}, "is external"),
    "dangling ref": ({"$ref": "#/$defs/missing"}, "points to nothing"),
    "deep nesting": ({"allOf": [{"allOf": [{}]}]}, ""),  # replaced below
    "int64 minimum": ({"type": "integer", "minimum": 2**63, "maximum": 2**63 + 10}, "64-bit"),
    "1e30 minimum": ({"type": "integer", "minimum": 1e30}, "64-bit"),
    "negative maxLength": ({"type": "string", "maxLength": -1}, "must not be negative"),
}


def _deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        node = {"type": "array", "items": node}
    return node


HOSTILE["deep nesting"] = (_deep(400), "nests deeper than 256 levels")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_schemas_are_refused_by_name(name: str) -> None:
    schema, message = HOSTILE[name]
    params = GuidedDecodingParams(json_schema=schema)
    start = time.perf_counter()
    with pytest.raises(GrammarError, match=message):
        GuideLimits().check(params)
    assert time.perf_counter() - start < 1.0  # linear: milliseconds even at these sizes


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_every_backend_checks_the_limits(backend: str) -> None:
    """Through a factory: refused before the backend compiles (and before ``auto``'s policy
    reads the guide)."""
    config = GuidedDecodingConfig(backend=backend, tokenizer=TokenizerInfo.default())  # type: ignore[arg-type]
    factory = create_grammar_matcher_factory(config)
    for schema, message in (HOSTILE["external ref"], HOSTILE["30k required"]):
        with pytest.raises(GrammarError, match=message):
            factory.create(GuidedDecodingParams(json_schema=schema))
    with pytest.raises(GrammarError, match="choices"):
        factory.create(GuidedDecodingParams(choice=[str(i) for i in range(20000)]))
    with pytest.raises(GrammarError, match="rules in the ebnf grammar"):
        ebnf = "root ::= r0\n" + "".join(f'r{i} ::= "x"\n' for i in range(2_001))
        factory.create(GuidedDecodingParams(ebnf=ebnf))


def test_limits_are_configurable() -> None:
    params = GuidedDecodingParams(json_schema={"enum": ["a", "b", "c"]})
    GuideLimits().check(params)
    with pytest.raises(GrammarError, match=r"GuideLimits.max_values"):
        GuideLimits(max_values=2).check(params)


def test_references_inside_the_schema_pass() -> None:
    for schema in (
        {"properties": {"child": {"$ref": "#"}}},  # recursion through the root
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "string"}}},
        {
            "$id": "http://example.com/root.json",
            "items": {"$ref": "item.json"},
            "$defs": {"item": {"$id": "item.json", "type": "integer"}},
        },
        {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
    ):
        GuideLimits().check(GuidedDecodingParams(json_schema=schema))


def test_a_dict_nested_too_deep_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nests too deeply"):
        GuidedDecodingParams(json_schema=_deep(10_000))


@pytest.mark.slow
@pytest.mark.data("jsonschemabench")
def test_every_real_schema_passes() -> None:
    """The defaults leave every schema of the shared JSONSchemaBench subsets alone."""
    files = sorted(DATA.glob("*.jsonl"))
    if not files:
        missing_data(DATA / "*.jsonl")
    limits = GuideLimits()
    for path in files:
        for line in path.read_text(encoding="utf-8").split("\n"):
            if line.strip():
                limits.check(GuidedDecodingParams(json_schema=json.loads(line)["schema"]))
