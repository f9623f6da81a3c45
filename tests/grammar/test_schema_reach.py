"""A guide's reach bounds the shortest completion from every state its outputs pass through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from guidedec.bitmask import allocate_bitmask
from guidedec.decoder.closing import CompletionSearch
from guidedec.grammar.guide_words import guide_words
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.grammar.schema_reach import (
    ANY_REACH,
    MAX_REACH,
    guide_reach,
    regex_reach,
    schema_reach,
)
from guidedec.testing.generate import sample_allowed_token
from guidedec.tokenizer import TokenizerInfo


def test_a_regex_reaches_as_far_as_its_longest_committed_branch() -> None:
    assert regex_reach("a|b{100}") >= 100  # after "b": 99 more
    assert regex_reach("(ab){10}") >= 20
    assert regex_reach(r"^\d{3}-\d{4}$") >= 8
    assert regex_reach("a*") >= 1
    assert regex_reach("[[[") == 6  # unreadable: twice its length


def test_required_values_and_min_items_add_up() -> None:
    integers = {"type": "array", "items": {"type": "integer"}, "minItems": 100}
    assert schema_reach(integers) >= 2 + 100 * 2  # "[0,0,...,0]"
    name_age = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    assert len('{"name":"","age":0}') <= schema_reach(name_age) <= 64
    assert schema_reach({"enum": ["x" * 70, "y"]}) >= 72  # after '"x': the rest of the x's
    as_float = {"type": "array", "items": {"type": "integer"}, "minItems": 100.0}
    assert schema_reach(as_float) == schema_reach(integers)


def test_a_branch_or_a_reference_counts_what_it_commits_to() -> None:
    long = {"type": "string", "minLength": 80}
    assert schema_reach({"anyOf": [{"type": "null"}, long]}) >= 82
    assert schema_reach({"$defs": {"long": long}, "$ref": "#/$defs/long"}) >= 82
    assert schema_reach({"allOf": [{"type": "string"}, long]}) >= 82


def test_a_recursion_counts_one_level_and_a_required_one_has_no_instance() -> None:
    tree = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
    }
    reach = schema_reach(tree)
    assert reach is not None and reach < MAX_REACH
    endless = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    assert schema_reach(endless) == MAX_REACH


def test_free_values_and_unread_guides() -> None:
    assert schema_reach(True) == ANY_REACH
    # any type: an object's is the farthest (a free name and a free value, one level counted)
    assert schema_reach({}) == schema_reach({"type": "object"}) < 20
    assert guide_reach(GuidedDecodingParams(json_object=True)) is not None
    assert guide_reach(GuidedDecodingParams(lark='start: "a"')) is None
    assert guide_reach(GuidedDecodingParams(choice=["a" * 90, "b"])) == 90


# --- the bound against the matcher: every state a random output passes through ---------------

_NAMES = st.text(alphabet="abcdefgh", min_size=1, max_size=24)
_LEAVES = st.one_of(
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 40)),
    st.builds(
        lambda values: {"enum": values},
        st.lists(st.text(alphabet="xyz", min_size=1, max_size=40), min_size=1, max_size=4),
    ),
    st.sampled_from(
        [
            {"type": "string", "pattern": p}
            for p in ("^a{30}$", "^(b|c{25})$", "^[0-9]{3}-[0-9]{4}$")
        ]
    ),
)


def _object(properties: dict[str, Any], required: list[bool]) -> dict[str, Any]:
    names = [name for name, keep in zip(properties, required, strict=False) if keep]
    return {
        "type": "object",
        "properties": properties,
        "required": names,
        "additionalProperties": False,
    }


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    objects = st.builds(
        _object,
        st.dictionaries(_NAMES, children, min_size=1, max_size=3),
        st.lists(st.booleans(), min_size=3, max_size=3),
    )
    arrays = st.builds(
        lambda item, n: {"type": "array", "items": item, "minItems": n},
        children,
        st.integers(0, 8),  # nested, the counts multiply: at most 512 items of items
    )
    return objects | arrays


_SCHEMAS = st.recursive(_LEAVES, _extend, max_leaves=5)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=_SCHEMAS, seed=st.integers(0, 2**16))
def test_from_every_state_of_a_random_output_a_completion_within_the_reach_exists(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    search: CompletionSearch,
    backend: str,
    schema: dict[str, Any],
    seed: int,
) -> None:
    """The reach, counted in tokens, against the search with no node limit to speak of: from
    each state of a random-logits output (up to 48 tokens, every fourth state searched), a
    completion of at most ``reach`` tokens, then the stop token, exists."""
    params = GuidedDecodingParams(json_schema=schema)
    reach = guide_reach(params, lambda text: len(tokenizer.encode(text)))
    assert reach is not None
    assume(reach < MAX_REACH)  # a reach cut to MAX_REACH bounds nothing (its window is 64)
    matcher = make_factory(backend).create(params)
    words = guide_words(params, tokenizer)
    rng = np.random.default_rng(seed)
    rows = allocate_bitmask(1, tokenizer.vocab_size)
    stops = set(tokenizer.stop_token_ids)
    written: list[int] = []
    for step in range(48):
        if step % 4 == 0:
            witness = search.witness(matcher, reach + 1, words=words, max_nodes=20_000)
            text = tokenizer.decode(written)
            assert witness is not None, f"no completion within {reach} tokens after {text!r}"
        matcher.fill_next_token_bitmask(rows, 0)
        token = sample_allowed_token(rows[0].numpy(), tokenizer.vocab_size, rng)
        if token in stops:
            break
        assert matcher.accept_token(token)
        written.append(token)


@pytest.fixture(scope="module")
def search(tokenizer: TokenizerInfo) -> CompletionSearch:
    return CompletionSearch(tokenizer)


_KEYWORDS = st.sampled_from(
    [
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "contains",
        "minContains",
        "minLength",
        "pattern",
        "format",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "then",
        "else",
        "minProperties",
        "patternProperties",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "minimum",
        "additionalItems",
    ]
)
_JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["#", "#/$defs/a", "object", "array", "string", "[a-", "^a{100000}$"]),
)
_ANY_JSON = st.recursive(
    _JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(_KEYWORDS | st.text(max_size=3), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(schema=_ANY_JSON)
def test_any_json_value_as_a_schema_gets_a_bounded_reach_or_none(schema: Any) -> None:
    """Whatever a request sends as its schema (wrong types under every keyword, dangling and
    cyclic references, unreadable patterns), the reach is computed without an error."""
    reach = schema_reach(schema)
    assert reach is None or 0 <= reach <= MAX_REACH
