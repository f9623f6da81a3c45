"""The root types of a JSON schema, and the first rows restricted to them under xgrammar.

Oracles: every valid instance of the shared data (JSON-Schema-Test-Suite, JSONSchemaBench) has
a type among its schema's root types; ``jsonschema`` on the outputs; the same decoder under
llguidance (which enforces the root type itself) restricts nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conftest import data_path
from datasets import read_jsonl
from guidedec import GuidedDecodingParams, TokenizerInfo
from guidedec.decoder.request import GuidedRequest
from guidedec.decoder.row_rules import RootTypeRule, RowRules, RuleStats
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.grammar.root_types import KINDS, RootTypes, root_types
from guidedec.grammar.ruled import RuledMatcher
from guidedec.testing import EngineChecks, make_decoder, uniform_guided_generate

# {"type": "object"} beside an allOf of two members: xgrammar guides it as any JSON value.
OBJECT_ALL_OF = {
    "type": "object",
    "allOf": [{"properties": {"a": {"type": "string"}}}, {"required": ["a"]}],
}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object"}, {"object"}),
        ({"type": ["integer", "null"]}, {"number", "null"}),
        ({"enum": [1, "a", None, True, [], {}]}, set(KINDS)),
        ({"const": False}, {"boolean"}),
        ({"type": ["string", "number"], "enum": ["a", "b"]}, {"string"}),
        ({"allOf": [{"type": ["string", "array"]}, {"type": "array"}]}, {"array"}),
        ({"anyOf": [{"type": "string"}, {"const": 1}]}, {"string", "number"}),
        ({"oneOf": [{"type": "string"}, {"minimum": 1}]}, None),  # a branch of any type
        ({"allOf": [{"minimum": 1}, {"anyOf": [{"type": "null"}]}]}, {"null"}),
        ({"type": "string", "const": 1}, set()),
        ({"properties": {"a": {"type": "string"}}}, None),
        (True, None),
        (False, set()),
    ],
)
def test_root_types_read_the_keywords_that_name_a_type(schema: Any, expected: Any) -> None:
    found = root_types(schema)
    assert (None if found is None else set(found)) == expected


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}[type(value)]


def _labelled_instances() -> list[tuple[Any, Any]]:
    pairs = []
    for path in sorted(data_path("json-schema-test-suite", "tests", "draft2020-12").glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            pairs += [(group["schema"], t["data"]) for t in group["tests"] if t["valid"]]
    for path in sorted(data_path("jsonschemabench").glob("*.jsonl")):
        for row in read_jsonl(path):
            pairs += [(row["schema"], t["data"]) for t in row["tests"] if t["valid"]]
    return pairs


def test_every_valid_instance_of_the_shared_data_has_one_of_its_root_types() -> None:
    """The restriction loses no valid output: over the shared data's valid instances, each
    one's type is among its schema's root types (where the schema names them)."""
    checked = 0
    for schema, instance in _labelled_instances():
        types = root_types(schema)
        if types is not None:
            assert _kind(instance) in types, (schema, instance)
            checked += 1
    assert checked > 1000


def test_the_root_stays_open_through_whitespace_only(tokenizer: TokenizerInfo) -> None:
    rules = RowRules(tokenizer)
    params = GuidedDecodingParams(json_schema=OBJECT_ALL_OF)
    (rule,) = rules.rules(params, "xgrammar", closing=False)
    assert isinstance(rule, RootTypeRule) and rule.active()
    spaces = tokenizer.encode("  \n")
    for token in spaces:
        rule.advance(token)
    assert rule.active()
    rule.advance(tokenizer.encode("{")[0])
    assert not rule.active()
    rule.rollback(1)  # a rejected draft token: the root has not started after all
    assert rule.active()
    rule.advance(tokenizer.encode("{")[0])
    rule.advance(tokenizer.encode(" ")[0])
    rule.rollback(1)
    assert not rule.active()
    # llguidance enforces the root type itself; a schema of any type restricts nothing.
    assert rules.rules(params, "llguidance", closing=False) == []
    anything = GuidedDecodingParams(json_schema={"minimum": 1})
    assert rules.rules(anything, "xgrammar", closing=False) == []


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_outputs_start_with_a_value_of_a_root_type(
    backend: str, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    """xgrammar guides ``OBJECT_ALL_OF`` as any JSON value, and random draws mostly start a
    number; with the restriction every output starts an object. Under llguidance no row
    needs it."""
    decoder = make_decoder(backend=backend, max_num_sequences=16)  # type: ignore[arg-type]
    decoder.factory = make_factory(backend)
    params = GuidedDecodingParams(json_schema=OBJECT_ALL_OF)
    outputs = uniform_guided_generate(
        decoder, [params] * 16, seed=3, max_tokens=12, checks=EngineChecks()
    )
    texts = [decoder.config.tokenizer.decode(o.token_ids) for o in outputs]
    assert all(text.lstrip().startswith("{") for text in texts), texts
    assert (decoder.rules.stats.root_restricted > 0) == (backend == "xgrammar")
    if backend == "xgrammar":
        # Without it, most outputs start something else (the grammar allows any value).
        decoder.rules.root_types = False
        outputs = uniform_guided_generate(decoder, [params] * 16, seed=3, max_tokens=12)
        texts = [decoder.config.tokenizer.decode(o.token_ids) for o in outputs]
        assert sum(not text.lstrip().startswith("{") for text in texts) > 8


def test_a_row_the_restriction_would_empty_is_left_as_it_was(tokenizer: TokenizerInfo) -> None:
    roots = RootTypes(tokenizer)
    forbidden = roots.forbidden(GuidedDecodingParams(json_schema={"type": "object"}), "xgrammar")
    assert forbidden is not None
    stats = RuleStats()
    rule = RootTypeRule(forbidden, roots.texts, stats)
    words = forbidden.copy()  # a row allowing only tokens that start another type
    rule.restrict(words)
    assert np.array_equal(words, forbidden) and stats.root_restricted == 0


def test_a_handed_off_request_s_first_token_ends_the_root(
    tokenizer: TokenizerInfo, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    """A generation-only request (disaggregated serving) gets its matcher and its first token
    in one step: after ``{`` its row allows keys again (a ``"`` starts a string, which the
    root's type would forbid)."""
    decoder = make_decoder(backend="xgrammar", max_num_sequences=1)
    decoder.factory = make_factory("xgrammar")
    params = GuidedDecodingParams(json_schema=OBJECT_ALL_OF)
    (brace,) = tokenizer.encode("{")
    (quote,) = tokenizer.encode('"')
    first = GuidedRequest.generation(
        params, request_id=0, seq_slot=0, new_token=brace, is_generation_only_first_iteration=True
    )
    decoder.add_batch([first])
    assert decoder.build() == []
    matcher = decoder.grammar_matchers[0]
    assert isinstance(matcher, RuledMatcher) and not matcher.rules[0].active()
    row = decoder.bitmask_host.numpy()[0].view(np.uint32)
    assert (int(row[quote >> 5]) >> (quote & 31)) & 1


def test_warm_up_builds_the_first_character_rows_once(tokenizer: TokenizerInfo) -> None:
    """After ``warm_up`` the tokenizer's first-character rows are kept (the engine builds them
    at start, not at the first restricted request), and a restricted request reads them."""
    RootTypes(tokenizer).warm_up()

    def rebuilt() -> object:
        raise AssertionError("the first-character rows are built again")

    kept = tokenizer.backend_object("first-chars", rebuilt)
    types = RootTypes(tokenizer)
    types.warm_up()
    forbidden = types.forbidden(GuidedDecodingParams(json_schema={"type": "object"}), "xgrammar")
    assert forbidden is not None
    assert np.array_equal(forbidden, kept.forbidden(frozenset({"object"})))  # type: ignore[attr-defined]
