"""Exact or explicit: complete JSON outputs are checked against the full schema."""

from __future__ import annotations

import json

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.engine.validation import OutputValidator

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": 5}, "tags": {"type": "array"}},
    "required": ["n"],
}


def test_problems_name_the_keyword_and_the_path() -> None:
    check = OutputValidator()
    params = GuidedDecodingParams(json_schema=SCHEMA)
    assert check.problem(params, '{"n": 3}') is None
    problem = check.problem(params, '{"n": 9}')
    assert problem is not None and "/n" in problem and "'maximum'" in problem
    assert "'required'" in (check.problem(params, "{}") or "")
    assert "not JSON" in (check.problem(params, '{"n": ') or "")
    as_object = GuidedDecodingParams(json_object=True)
    assert check.problem(as_object, "[1]") == "the output is not a JSON object"
    assert check.problem(as_object, "{}") is None
    assert check.problem(GuidedDecodingParams(regex="a+"), "b") is None  # not JSON: no check
    unreadable = GuidedDecodingParams(json_schema={"type": 12})
    assert check.problem(unreadable, "1") is None  # no validator: nothing to judge by


def test_a_schema_that_breaks_its_metaschema_judges_nothing() -> None:
    """``"required": "name"`` is not a list: jsonschema would report the missing property
    ``n`` (it iterates the string). Such a schema cannot judge an output."""
    check = OutputValidator()
    broken = GuidedDecodingParams(json_schema={"type": "object", "required": "name"})
    assert check.problem(broken, "{}") is None
    assert list(check.errors(broken, {})) == []


def test_the_metaschema_is_checked_once_and_only_when_an_error_turns_up(monkeypatch) -> None:
    from jsonschema import Draft202012Validator

    calls = []
    real = Draft202012Validator.check_schema
    monkeypatch.setattr(
        Draft202012Validator,
        "check_schema",
        classmethod(lambda cls, schema, **kw: calls.append(schema) or real(schema, **kw)),
    )
    check = OutputValidator()
    params = GuidedDecodingParams(json_schema=SCHEMA)
    for n in range(5):
        assert check.problem(params, f'{{"n": {n}}}') is None
    assert calls == []  # valid outputs: no metaschema check
    assert "'maximum'" in (check.problem(params, '{"n": 9}') or "")
    assert "'maximum'" in (check.problem(params, '{"n": 8}') or "")
    assert calls == [SCHEMA]


def test_an_approximated_schema_never_ends_stop_with_an_invalid_output() -> None:
    """``not`` is refused by llguidance and dropped by xgrammar, so ``auto`` guides with the
    approximation: outputs that break the ``not`` end ``grammar_error`` naming it."""
    schema = {"type": "integer", "minimum": 0, "maximum": 3, "not": {"const": 2}}
    guide = GuidedDecodingParams(json_schema=schema)
    llm = LLM("tiny-random", max_num_seqs=8)
    params = [
        SamplingParams(max_tokens=8, temperature=1.0, seed=s, guided_decoding=guide)
        for s in range(24)
    ]
    outputs = llm.generate(["Number:"] * 24, params)
    llm.close()
    stops = [o for o in outputs if o.finish_reason == "stop"]
    errors = [o for o in outputs if o.finish_reason == "grammar_error"]
    assert stops and errors and len(stops) + len(errors) == 24
    assert all(json.loads(o.text) in (0, 1, 3) for o in stops)
    assert all(json.loads(o.text) == 2 and "'not'" in (o.error or "") for o in errors)
    assert llm.stats.invalid_outputs == len(errors)
