"""The scoring of ``guidedec bench quality`` and its extraction set."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guidedec.bench.extraction_set import EXTRACTION, FIELDS, SCHEMA, record_schema
from guidedec.bench.quality import Tally, field_right, first_object, score, wilson


def test_the_set_has_sixty_distinct_sentences_that_state_their_facts() -> None:
    assert len(EXTRACTION) == 60
    assert len({sentence for sentence, _ in EXTRACTION}) == 60
    for sentence, facts in EXTRACTION:
        assert set(facts) == set(FIELDS)
        assert facts["name"] in sentence and facts["city"] in sentence, sentence
        assert 0 < facts["age"] < 120
        jsonschema.validate(facts, SCHEMA)


def test_the_reversed_schema_lists_the_keys_the_other_way_round() -> None:
    reversed_schema = record_schema(FIELDS[::-1])
    assert list(reversed_schema["properties"]) == ["occupation", "city", "age", "name"]
    assert reversed_schema["properties"] == SCHEMA["properties"]
    assert set(reversed_schema["required"]) == set(SCHEMA["required"])


def test_the_first_object_is_read_out_of_prose() -> None:
    assert first_object('Sure! {"a": 1} and {"b": 2}') == {"a": 1}
    assert first_object('{not json} then [1] then {"x": {"y": 2}}') == {"x": {"y": 2}}
    assert first_object("no object at all") is None
    assert first_object('{"open": ') is None


@pytest.mark.parametrize(
    ("name", "got", "want", "right"),
    [
        ("name", "maria lópez", "Maria Lopez", True),
        ("name", "Maria", "Maria Lopez", False),
        ("occupation", "a nurse.", "nurse", True),
        ("occupation", "Nursing", "nurse", False),
        ("city", "Lisbon, Portugal", "Lisbon", True),
        ("city", "Porto", "Lisbon", False),
        ("age", 34, 34, True),
        ("age", "34", 34, True),
        ("age", 35, 34, False),
        ("age", "thirty-four", 34, False),
        ("age", True, 1, False),
    ],
)
def test_a_field_is_right_only_when_it_is_the_fact(
    name: str, got: object, want: object, right: bool
) -> None:
    assert field_right(name, got, want) is right


def test_score_counts_each_field_and_the_records_all_right() -> None:
    facts = EXTRACTION[0][1]
    tally = Tally()
    all_right = score(json.dumps(facts), facts, tally)
    half = score(json.dumps({**facts, "age": facts["age"] + 1, "city": "Nowhere"}), facts, tally)
    broken = score('{"name": ', facts, tally)
    assert all(all_right.values())
    assert half == {"name": True, "age": False, "city": False, "occupation": True}
    assert not any(broken.values())
    assert (tally.outputs, tally.parsed, tally.all_right, tally.right) == (3, 2, 1, 6)


@given(st.integers(0, 500), st.integers(1, 500))
def test_the_wilson_interval_holds_the_proportion(successes: int, total: int) -> None:
    successes = min(successes, total)
    low, high = wilson(successes, total)
    assert 0.0 <= low <= successes / total <= high <= 1.0
    assert high - low < 2 * 1.96 * math.sqrt(0.25 / total) + 1e-9
