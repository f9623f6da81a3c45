"""``guidedec bench quality``: its tasks, their judges, its tallies, and one real run."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guidedec.bench import bfcl
from guidedec.bench.extraction_set import EXTRACTION, FIELDS, SCHEMA, record_schema
from guidedec.bench.quality import main, tight
from guidedec.bench.quality.puzzles import PUZZLES, answer_in, same
from guidedec.bench.quality.report import overview, tally, task_table, wilson
from guidedec.bench.quality.runners import Job, Output
from guidedec.bench.quality.tasks import (
    BFCL_CATEGORIES,
    bfcl_task,
    calls_in,
    extraction,
    field_right,
    fields_right,
    first_object,
    load_tasks,
    puzzle_task,
    python_calls,
)


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


def test_the_whole_output_or_else_the_first_object_is_read() -> None:
    assert first_object('Sure! {"a": 1} and {"b": 2}') == {"a": 1}
    assert first_object('{not json} then [1] then {"x": {"y": 2}}') == {"x": {"y": 2}}
    assert first_object('{"whole": {"inner": 1}}') == {"whole": {"inner": 1}}
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


def test_extraction_is_judged_by_field_and_validity() -> None:
    task = extraction(3)
    item = task.items[0]
    facts = item.truth
    whole = task.judge(json.dumps(facts), item)
    half = task.judge(
        "Here: " + json.dumps({**facts, "age": facts["age"] + 1, "city": "Nowhere"}), item
    )
    broken = task.judge('{"name": ', item)
    assert (whole.right, whole.found, whole.valid) == (4, True, True)
    assert (half.right, half.found, half.valid) == (2, True, False)
    assert (broken.right, broken.found, broken.valid) == (0, False, False)
    assert fields_right("Here: " + json.dumps({**facts, "age": 0}), facts)["age"] is False


def _expected_calls(question: bfcl.Question) -> list[dict[str, Any]]:
    """A right answer built from the question's ground truth (each argument's first value)."""
    openai_name = {own: name for name, own in question.names.items()}
    calls = []
    for answer in question.answers:
        ((name, values),) = answer.items()
        arguments = {a: _first(v) for a, v in values.items() if v and v[0] != ""}
        calls.append({"name": openai_name[name], "arguments": arguments})
    return calls


def _first(options: list[Any]) -> Any:
    """The first acceptable value (in a dict, each key's first, the ones that may be left out
    left out)."""
    value = options[0]
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if v and v[0] != ""}
    return value


@pytest.mark.parametrize("category", BFCL_CATEGORIES)
def test_a_bfcl_answer_built_from_the_ground_truth_is_right_and_valid(category: str) -> None:
    task = bfcl_task(category, 10)
    assert len(task.items) == 10
    for item in task.items:
        calls = _expected_calls(item.truth)
        text = json.dumps(calls)
        verdict = task.judge(text, item)
        assert verdict.right == 1 and verdict.found, (item.id, text)
        wrong = [{**calls[0], "name": "no_such_function"}, *calls[1:]]
        assert task.judge(json.dumps(wrong), item).right == 0
        assert not task.judge(json.dumps(wrong), item).valid
        fenced = task.judge(f"Sure:\n```json\n{text}\n```", item)
        assert fenced.right == 1 and not fenced.valid
        system = item.messages[0]
        assert system["role"] == "system"
        for tool in bfcl.request_tools(item.truth):
            assert json.dumps(tool["function"]) in system["content"]


def test_calls_are_read_from_an_array_an_object_or_prose() -> None:
    one = {"name": "f", "arguments": {"x": 1}}
    assert calls_in(json.dumps([one, one])) == [("f", {"x": 1})] * 2
    assert calls_in(json.dumps(one)) == [("f", {"x": 1})]
    assert calls_in(f"I will call {json.dumps(one)} now") == [("f", {"x": 1})]
    cut = json.dumps([one, {**one, "name": "g"}, one])[:-20]
    assert calls_in(cut) == [("f", {"x": 1}), ("g", {"x": 1})]
    assert calls_in("Calls: " + cut) == [("f", {"x": 1}), ("g", {"x": 1})]
    assert calls_in('{"x": 1}') is None
    assert calls_in("[]") is None
    assert calls_in("no calls") is None


def test_an_unguided_answer_in_python_is_read_with_its_parameters_named() -> None:
    task = bfcl_task("simple_python", 1)
    item = task.items[0]  # calculate_triangle_area(base=10, height=5, unit="units")
    assert python_calls("area = calculate_triangle_area(10, h=5)", item.truth.names) == [
        ("calculate_triangle_area", ([10], {"h": 5}))
    ]
    assert task.judge("Call `calculate_triangle_area(10, 5)` to get it.", item).right == 1
    assert task.judge("calculate_triangle_area(base=10, height=6)", item).right == 0
    assert task.judge("unknown_function(10, 5) or calculate_triangle_area(", item).found is False
    assert python_calls("calculate_triangle_area(base=x)", item.truth.names) is None


def test_the_puzzles_are_120_distinct_questions_with_their_answers() -> None:
    assert len(PUZZLES) == 120
    assert len({p.prompt for p in PUZZLES}) == 120
    for p in PUZZLES:
        numbers = [int(n) for n in re.findall(r"\d+", p.prompt.split("?")[0])]
        word = re.search(r"'(\w+)'", p.prompt)
        if "+" in p.prompt:
            assert p.answer == sum(numbers)
        elif "largest" in p.prompt:
            assert p.answer == max(numbers)
        elif "first letter" in p.prompt:
            assert word is not None and p.answer == word.group(1)[0]
        else:
            assert word is not None and p.answer == word.group(1)[-1]
        jsonschema.validate({"answer": p.answer}, p.schema)


def test_a_puzzle_answer_is_read_from_json_or_fairly_from_prose() -> None:
    assert answer_in('{"answer": 3} then {"answer": 13}', 13) == 13
    assert answer_in("7 + 6 = 13.", 13) == 13
    assert answer_in('The first letter of "yellow" is "Y".', "y") == "Y"
    assert answer_in("no answer here", "y") is None
    assert same("Y", "y") and same("13", 13) and not same(True, 1) and not same("x", 13)
    task = puzzle_task(4)
    first = task.items[0]
    assert task.judge(json.dumps({"answer": first.truth}), first).valid


def test_a_tally_counts_right_found_valid_and_forced() -> None:
    task = puzzle_task(3)
    outputs = [
        Output(json.dumps({"answer": task.items[0].truth}), 5, "stop"),
        Output('{"answer": 0}', 4, "length", forced=0.5),
        Output("no idea", 9, "stop"),
    ]
    t, rows = tally(task, outputs, 2.0)
    assert (t.right, t.units, t.found, t.valid, t.closed, t.tokens) == (1, 3, 2, 2, 1, 18)
    assert t.forced == 0.5 and [r["right"] for r in rows] == [1, 0, 0]
    table = task_table(task, {"guided": t})
    assert "| guided | 1/3 (33%) |" in table and "| 1 (50%) |" in table
    assert t.right_valid == 1 and "| 2/3 | 1/3 | 1 (50%) |" in table
    assert "33% (2/3 valid)" in overview([task], {task.name: {"guided": t}})


def test_tight_budgets_are_three_quarters_of_the_guided_tokens() -> None:
    job = Job([[1], [2], [3], [4]], [{}, {}, {}, {}], [96, 96, 96, 96])
    outputs = [Output("", n, "stop") for n in (8, 3, 7, 1)]
    assert tight(job, outputs).budgets == [6, 3, 6, 2]


@given(st.integers(0, 500), st.integers(1, 500))
def test_the_wilson_interval_holds_the_proportion(successes: int, total: int) -> None:
    successes = min(successes, total)
    low, high = wilson(successes, total)
    assert 0.0 <= low <= successes / total <= high <= 1.0
    assert high - low < 2 * 1.96 * math.sqrt(0.25 / total) + 1e-9


def test_load_tasks_cuts_each_task_to_the_limit() -> None:
    tasks = load_tasks(["extraction", "bfcl parallel", "puzzles"], 5)
    assert [t.name for t in tasks] == ["extraction", "bfcl parallel", "puzzles"]
    assert [len(t.items) for t in tasks] == [5, 5, 5]


def test_a_real_run_writes_its_report_and_guided_outputs_are_valid(tmp_path: Path) -> None:
    """Four puzzles on the real model: guidedec guided, thinking first, and transformers with
    xgrammar's processor; every guided output parses under its schema."""
    command = [sys.executable, "-m", "guidedec", "bench", "quality", "--tasks", "puzzles"]
    command += ["--limit", "4", "--modes", "guided", "think first", "transformers + xgrammar"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_quality.json").read_text())
    results = report["results"]["puzzles"]
    for mode in ("guided", "think first", "transformers + xgrammar"):
        assert results[mode]["outputs"] == results[mode]["valid"] == 4, results[mode]
    assert (tmp_path / "quality.png").stat().st_size > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| guided |" in summary
    again = tmp_path / "again"
    main(["--rescore", str(tmp_path / "bench_quality.json"), "--out", str(again)])
    assert (again / "summary.md").read_text() == summary  # the same judges, the same tables
