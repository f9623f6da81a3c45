"""``guidedec bench tools``: BFCL's questions as OpenAI tools, the AST-style checker, vLLM's chat
template that shows the tools as guidedec does, and a short run through guidedec's server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from guidedec import TokenizerInfo
from guidedec.bench import bfcl
from guidedec.bench.tools import HIDDEN, TOOLS_TEMPLATE, main
from guidedec.engine.chat import render_chat

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's template (its system line shortened): it renders no tools."""


def _question(answers: list[dict[str, Any]], **properties: Any) -> bfcl.Question:
    function = {
        "name": "geo.distance",
        "description": "Distance between two cities.",
        "parameters": {
            "type": "dict",
            "properties": properties,
            "required": [k for k, v in properties.items() if not v.get("optional")],
        },
    }
    messages = [{"role": "user", "content": "How far?"}]
    return bfcl.Question("q", "simple_python", messages, [bfcl.openai_tool(function)], answers)


QUESTION = _question(
    [{"geo.distance": {"a": ["Paris"], "b": ["New York", "NYC"], "km": [True, ""]}}],
    a={"type": "string"},
    b={"type": "string"},
    km={"type": "boolean", "optional": True},
)


def test_bfcl_functions_become_openai_tools_with_json_schema_types() -> None:
    tool = bfcl.openai_tool(
        {
            "name": "math.hypot",
            "parameters": {
                "type": "dict",
                "properties": {
                    "x": {"type": "float"},
                    "p": {"type": "tuple", "items": {"type": "any"}},
                    "type": {"type": "string"},  # a property named "type"
                },
            },
        }
    )
    function = tool["function"]
    assert function["name"] == "math_hypot" and function["x-bfcl-name"] == "math.hypot"
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    assert parameters["properties"]["x"] == {"type": "number"}
    assert parameters["properties"]["p"] == {"type": "array", "items": {}}
    assert parameters["properties"]["type"] == {"type": "string"}


@pytest.mark.parametrize(
    ("calls", "right"),
    [
        ([("geo_distance", {"a": "Paris", "b": "New York"})], True),
        ([("geo_distance", {"a": "paris", "b": "NYC", "km": True})], True),  # case, alternatives
        ([("geo_distance", {"a": "Paris", "b": "new-york"})], True),  # punctuation and spaces
        ([("geo_distance", {"a": "Paris"})], False),  # a required argument missing
        ([("geo_distance", {"a": "Paris", "b": "NYC", "km": False})], False),
        ([("geo_distance", {"a": "Paris", "b": "NYC", "mode": "car"})], False),  # unknown arg
        ([("geo_distances", {"a": "Paris", "b": "NYC"})], False),
        ([("geo_distance", {"a": "Paris", "b": "NYC"})] * 2, False),  # one call expected
        ([], False),
    ],
)
def test_a_call_is_right_as_bfcl_s_ast_check_says(calls: list[Any], right: bool) -> None:
    assert bfcl.correct(calls, QUESTION) is right


def test_parallel_calls_match_in_any_order_once_each() -> None:
    question = _question(
        [
            {"geo.distance": {"a": ["Paris"], "b": [1.5]}},
            {"geo.distance": {"a": ["Rome"], "b": [2]}},
        ],
        a={"type": "string"},
        b={"type": "float"},
    )
    rome, paris = (
        ("geo_distance", {"a": "Rome", "b": 2.0}),
        ("geo_distance", {"a": "Paris", "b": 1.5}),
    )
    assert bfcl.correct([rome, paris], question)
    assert not bfcl.correct([paris, paris], question)
    assert bfcl.correct([("geo_distance", {"a": "Rome", "b": 2}), paris], question)  # int for float
    assert not bfcl.correct([("geo_distance", {"a": "Rome", "b": "2"}), paris], question)


def test_a_valid_call_names_a_tool_with_arguments_its_schema_admits() -> None:
    assert bfcl.valid([("geo_distance", {"a": "Paris", "b": "x"})], QUESTION)
    assert not bfcl.valid([("geo_distance", {"a": "Paris"})], QUESTION)
    assert not bfcl.valid([("geo_distance", {"a": "Paris", "b": 3})], QUESTION)
    assert not bfcl.valid([("distance", {"a": "Paris", "b": "x"})], QUESTION)
    assert not bfcl.valid([], QUESTION)


def test_the_real_categories_load_with_their_answers() -> None:
    for category in bfcl.CATEGORIES:
        questions = bfcl.load(category, 3)
        assert len(questions) == 3 and all(q.answers and q.tools for q in questions)
        for question in questions:
            assert set(question.names.values()) >= {next(iter(a)) for a in question.answers}


def test_vllm_s_template_shows_the_tools_as_guidedec_does(tokenizer: TokenizerInfo) -> None:
    """vLLM's prompt is guidedec's, character for character (the bench checks the tokens
    through both servers' ``/tokenize`` too)."""
    hf = tokenizer.hf_tokenizer
    for category in bfcl.CATEGORIES:
        for question in bfcl.load(category, 4):
            tools = bfcl.request_tools(question)
            for messages in (
                question.messages,
                [{"role": "system", "content": "Be brief."}, *question.messages],
            ):
                ours = render_chat(messages, hf, chat_template=CHATML, tools=tools)
                theirs = render_chat(messages, hf, chat_template=TOOLS_TEMPLATE, tools=tools)
                assert ours == theirs
                assert json.dumps(tools[0]) in ours
    hidden = render_chat(
        QUESTION.messages, hf, chat_template=HIDDEN + CHATML, tools=bfcl.request_tools(QUESTION)
    )
    assert "geo_distance" not in hidden


@pytest.mark.real
def test_a_short_run_through_guidedec_s_server(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--per-category", "1", "--modes", "required", "named", "--max-tokens", "64"])
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| guidedec")]
    assert len(rows) == 4  # tools shown and not, required and named
    for row in rows:
        valid = row.split("|")[6].strip()
        assert valid.split(" ")[0] in ("3/3", "2/2"), row  # every guided call is valid
