"""Steering: outputs of a schema xgrammar only approximates are kept valid where the model has
another choice, ended ``grammar_error`` at once where it has none, and unchanged otherwise."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.engine.steering import ValueSteering
from guidedec.engine.validation import OutputValidator
from guidedec.grammar.json_prefix import scan_prefix

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10_000, 10_000),
    st.text('ab"\\ ,:{}[]é', max_size=4),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text("abk,:", max_size=3), inner, max_size=3),
    ),
    max_leaves=8,
)


def _at(value: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def _closed_paths(value: Any, path: tuple[str | int, ...] = ()) -> Any:
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _closed_paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _closed_paths(child, (*path, index))


@settings(max_examples=400, deadline=None)
@given(value=_VALUES, indent=st.sampled_from([None, 1]), data=st.data())
def test_scan_prefix_keeps_exactly_the_settled_values(value: Any, indent: Any, data: Any) -> None:
    """At any cut of a JSON text: ``closed`` parses, and each of its values outside the open
    path is the value the whole text holds there."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    cut = data.draw(st.integers(0, len(text)))
    prefix = scan_prefix(text[:cut])
    if prefix.closed is None:
        assert prefix.open_path == ()
        return
    closed = json.loads(prefix.closed)
    if prefix.open_path is None:
        assert closed == value
        return
    for path in _closed_paths(closed):
        if prefix.open_path[: len(path)] != path:
            assert _at(closed, path) == _at(value, path), (text[:cut], path)
        assert _at(value, path) is not None or _at(closed, path) is None


def test_scan_prefix_examples() -> None:
    assert scan_prefix('{"a": 1, "b": [true, "x').open_path == ("b", 1)
    assert scan_prefix('{"a": 1, "b": [true, "x').closed == '{"a": 1, "b": [true]}'
    assert scan_prefix('{"a": 12').open_path == ("a",)  # the number may go on
    assert scan_prefix('{"a": 12 ').closed == '{"a": 12}'
    assert scan_prefix('{"a"').closed == "{}"
    assert scan_prefix('{"a": {}} ').open_path is None
    assert scan_prefix("12").closed is None


def _problem(schema: dict[str, Any], text: str) -> str | None:
    steering = ValueSteering(OutputValidator(), lambda: None)  # type: ignore[arg-type,return-value]
    return steering.problem(GuidedDecodingParams(json_schema=schema), text)


def test_only_settled_errors_count() -> None:
    schema = {
        "type": "object",
        "properties": {"w": {"type": "string", "not": {"maxLength": 2}}, "n": {"type": "integer"}},
        "required": ["w", "n"],
        "if": {"properties": {"n": {"const": 1}}},
        "then": {"properties": {"w": {"const": "abc"}}},
    }
    assert _problem(schema, '{"w": "ab') is None  # the string is open
    assert "/w (keyword 'not')" in (_problem(schema, '{"w": "ab"') or "")
    assert _problem(schema, '{"w": "abcd"') is None  # "required n" is for later
    assert _problem(schema, '{"w": "abcd", "n": 1') is None  # n may go on
    assert _problem(schema, '{"w": "abcd", "n": 1,') is None  # then: judged once closed
    assert "keyword 'const'" in (_problem(schema, '{"w": "abcd", "n": 1}') or "")


WORD_SCHEMA = {
    "type": "object",
    "properties": {"word": {"type": "string", "not": {"maxLength": 3}}},
    "required": ["word"],
    "additionalProperties": False,
}


def _run(steer: bool) -> list[Any]:
    # A steered request proposes no drafts: with jump-forward, a sampled output keeps its
    # distribution but not its tokens, so both runs decode one token per step.
    llm = LLM("tiny-random", backend="xgrammar", max_num_seqs=32, jump_forward=False)
    if not steer:
        llm.steering.applies = lambda *_: False  # type: ignore[method-assign]
    params = [
        SamplingParams(
            temperature=1.0,
            seed=seed,
            max_tokens=160,
            guided_decoding=GuidedDecodingParams(json_schema=WORD_SCHEMA),
        )
        for seed in range(32)
    ]
    outputs = llm.generate(["x"] * 32, params)
    assert llm.steering.stats.steered > 0 or not steer
    llm.close()
    return outputs


@pytest.mark.slow
def test_steering_keeps_outputs_valid_and_changes_no_valid_one() -> None:
    """xgrammar ignores ``not``: unsteered, some words are too short (``grammar_error`` from the
    final check); steered, every output validates, and each output that was valid unsteered is
    the same token for token."""
    steered, unsteered = _run(True), _run(False)
    assert any(out.finish_reason == "grammar_error" for out in unsteered)
    for with_, without in zip(steered, unsteered, strict=True):
        assert with_.complete, with_.error  # by itself, or closed within its budget
        jsonschema.validate(json.loads(with_.text), WORD_SCHEMA)
        if without.complete:
            assert with_.token_ids == without.token_ids


def test_no_way_back_ends_at_once() -> None:
    """A value the grammar completes in one way only (the enum's other values are gone): the
    output ends ``grammar_error`` naming the keyword as soon as the value is out."""
    schema = {
        "type": "object",
        "properties": {"tag": {"type": "string", "not": {"pattern": "^a"}, "enum": ["ab", "ba"]}},
        "required": ["tag"],
        "additionalProperties": False,
    }
    llm = LLM("tiny-random", backend="xgrammar", max_num_seqs=8)
    params = [
        SamplingParams(
            temperature=1.0,
            seed=seed,
            max_tokens=200,
            guided_decoding=GuidedDecodingParams(json_schema=schema),
        )
        for seed in range(8)
    ]
    outputs = llm.generate(["Tag:"] * 8, params)
    broken = [out for out in outputs if out.finish_reason == "grammar_error"]
    assert broken, [out.text for out in outputs]
    for out in outputs:
        if out.finish_reason == "grammar_error":
            assert "/tag (keyword 'not')" in (out.error or "")
            # ended by the token that closed the value, not at the budget
            assert out.text.rstrip(" \t\r\n}").endswith('"ab"'), out.text
        else:
            jsonschema.validate(json.loads(out.text), schema)
    assert llm.steering.stats.given_up == len(broken)
    llm.close()


class _CountingValidator(OutputValidator):
    calls = 0

    def errors(self, params: GuidedDecodingParams, instance: Any) -> Any:
        self.calls += 1
        return super().errors(params, instance)


def test_a_settled_text_is_judged_once() -> None:
    """What a check reads of the output (its settled values and its open path) decides the
    verdict: a later check that settles nothing new (whitespace, a separator) reuses it, with
    no validation; a different settled text or open path is judged anew, and gets its own
    verdict."""
    validator = _CountingValidator()
    steering = ValueSteering(validator, lambda: None)  # type: ignore[arg-type,return-value]
    params = GuidedDecodingParams(json_schema=WORD_SCHEMA)
    short = steering.problem(params, '{"word": "ab"')
    assert short is not None and "keyword 'not'" in short and validator.calls == 1
    assert steering.problem(params, '{"word": "ab"  \n') == short
    assert validator.calls == 1 and steering.stats.checks == 2
    assert steering.problem(params, '{"word": "abcd"') is None and validator.calls == 2
    other = GuidedDecodingParams(json_schema={**WORD_SCHEMA, "properties": {"word": {}}})
    assert steering.problem(other, '{"word": "ab"') is None and validator.calls == 3


def test_a_token_neither_check_applies_to_is_kept_without_a_check(tokenizer: Any) -> None:
    """``check_sampled`` asks closing to check a token only when ``BudgetCloser.checks`` says
    so, and steering only for a token with a structural character: otherwise the token is
    kept as drawn, and nothing is redrawn."""
    from guidedec.decoder.closing import BudgetCloser
    from guidedec.decoder.token_checks import TokenChecks
    from guidedec.engine.steering import SampledToken, check_sampled

    closer = BudgetCloser(tokenizer, num_slots=1)
    asked: list[int] = []
    closer.checks = lambda slot, left: bool(asked.append(left))  # type: ignore[method-assign]
    closer.admits = lambda *args: pytest.fail("admits ran")  # type: ignore[method-assign]
    steering = ValueSteering(OutputValidator(), lambda: closer.vocab().structural)
    steering.problem = lambda *args: pytest.fail("steering checked")  # type: ignore[method-assign]
    params = GuidedDecodingParams(json_schema=WORD_SCHEMA)
    (content,) = tokenizer.encode("ab")
    kept = check_sampled(
        SampledToken(content, params, 0, 10, [], closing=True, steered=True),
        TokenChecks([None], lambda: closer),
        steering,
        tokenizer,
        lambda banned: pytest.fail("redrawn"),
    )
    assert kept == (content, None) and asked == [10]
