"""Tool-call formats (``--tool-call-parser``): each guide admits its format's calls, with the
tools' arguments exactly, and refuses others; each scan reads the calls back, as the text
grows too."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guidedec import GrammarMatcherFactory, TokenizerInfo
from guidedec.cli import TOOL_CALL_PARSERS
from guidedec.grammar.closed_objects import close_every_object
from guidedec.server.structured import RequestError
from guidedec.server.tool_calls import (
    TOOL_PARSERS,
    ToolSettings,
    detect_parser,
    new_call,
    tool_calls_for,
)
from guidedec.server.tool_stream import ToolCallStream
from guidedec.testing import accepts_output

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
DAYS = {
    "type": "object",
    "properties": {
        "days": {"type": "integer"},
        "places": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["days"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "forecast", "parameters": DAYS}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
Call = tuple[str, dict[str, Any]]
PARIS: Call = ("get_weather", {"city": "Paris", "unit": "c"})
THREE: Call = ("forecast", {"days": 3, "places": ["Oslo", "Rome"]})


def write(parser: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Calls as a model trained on the format writes them."""
    if parser == "hermes":
        body = [json.dumps({"name": n, "arguments": a}) for n, a in calls]
        return "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in body)
    if parser == "llama3_json":
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    if parser == "mistral":
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    assert parser == "pythonic"
    written = []
    for name, arguments in calls:
        kwargs = ", ".join(f"{k}={_py(v)}" for k, v in arguments.items())
        written.append(f"{name}({kwargs})")
    return "[" + ", ".join(written) + "]"


def _py(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return json.dumps(value)


PARSERS = sorted(TOOL_PARSERS)


def _calls(parser: str | None, choice: Any, parallel: bool = True) -> Any:
    calls = tool_calls_for(TOOLS, choice, parallel=parallel, parser=parser, auto_enabled=True)
    assert calls is not None
    return calls


def _read(calls: Any, text: str) -> tuple[str | None, list[tuple[str, dict[str, Any]]]]:
    content, tool_calls = calls.message(text)
    return content, [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls
    ]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("parser", PARSERS)
def test_required_admits_the_format_s_calls_and_nothing_else(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    backend: str,
    parser: str,
) -> None:
    calls, factory = _calls(parser, "required"), make_factory(backend)
    guide = calls.guide()
    for written in ([PARIS], [PARIS, THREE]):
        text = write(parser, written)
        assert accepts_output(factory, tokenizer, guide, text), text
        assert _read(calls, text) == (None, written)
    bad_unit = ("get_weather", {"city": "Paris", "unit": "k"})
    missing: tuple[str, dict[str, Any]] = ("forecast", {"places": []})
    unknown = ("get_weathe", {"city": "Paris", "unit": "c"})
    for wrong in ([bad_unit], [missing], [unknown], [PARIS, bad_unit]):
        assert not accepts_output(factory, tokenizer, guide, write(parser, wrong)), wrong
    assert not accepts_output(factory, tokenizer, guide, "It is sunny.")
    one = _calls(parser, "required", parallel=False).guide()
    assert accepts_output(factory, tokenizer, one, write(parser, [PARIS]))
    assert not accepts_output(factory, tokenizer, one, write(parser, [PARIS, THREE]))


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("parser", PARSERS)
def test_a_named_tool_admits_its_call_only(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    backend: str,
    parser: str,
) -> None:
    calls, factory = _calls(parser, NAMED), make_factory(backend)
    guide = calls.guide()
    text = write(parser, [PARIS])
    assert accepts_output(factory, tokenizer, guide, text)
    assert _read(calls, text) == (None, [PARIS])
    assert calls.finish_reason("stop", 1) == "stop"
    for wrong in ([THREE], [PARIS, PARIS], [("get_weather", {"city": "Paris"})]):
        assert not accepts_output(factory, tokenizer, guide, write(parser, wrong)), wrong


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("parser", PARSERS)
def test_auto_admits_text_and_guides_each_call_it_starts(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    backend: str,
    parser: str,
) -> None:
    calls, factory = _calls(parser, "auto"), make_factory(backend)
    guide = calls.guide()
    prose = "It is sunny in Paris [citation], 21 degrees."
    assert accepts_output(factory, tokenizer, guide, prose)
    assert _read(calls, prose) == (prose, [])
    text = "Let me check.\n" + write(parser, [PARIS])
    assert accepts_output(factory, tokenizer, guide, text)
    assert _read(calls, text) == ("Let me check.", [PARIS])
    assert calls.finish_reason("stop", 1) == "tool_calls"
    bad = "Let me check.\n" + write(parser, [("get_weather", {"city": "Paris", "unit": "k"})])
    assert not accepts_output(factory, tokenizer, guide, bad)


@pytest.mark.parametrize("parser", PARSERS)
@given(cut=st.integers(min_value=0, max_value=400))
def test_a_stream_sends_the_same_calls_and_text_as_the_whole_output(parser: str, cut: int) -> None:
    """Streamed in two steps cut anywhere, and then token by token: the content and the
    calls' names and arguments add up to what the whole output gives."""
    calls = _calls(parser, "auto")
    text = "Checking the weather.\n" + write(parser, [PARIS, THREE])
    content, whole = _read(calls, text)
    stream = ToolCallStream(calls)
    steps = [
        text[: min(cut, len(text))],
        *[text[:i] for i in range(min(cut, len(text)), len(text))],
    ]
    sent, names, arguments = "", list[str](), list[str]()
    for i, so_far in enumerate([*steps, text]):
        piece, deltas = stream.deltas(so_far, final=i == len(steps))
        sent += piece
        for delta in deltas:
            if "id" in delta:
                assert delta["index"] == len(names)
                names.append(delta["function"]["name"])
                arguments.append("")
            arguments[delta["index"]] += delta["function"]["arguments"]
    assert sent.strip() == content
    assert [(n, json.loads(a)) for n, a in zip(names, arguments, strict=True)] == whole


@pytest.mark.parametrize("parser", PARSERS)
def test_text_that_may_start_a_call_waits_for_what_follows(parser: str) -> None:
    calls = _calls(parser, "auto")
    stream = ToolCallStream(calls)
    trigger = calls.parser.triggers[0]
    piece, _ = stream.deltas("Hi " + trigger[:-1])
    assert piece == "Hi"
    piece, deltas = stream.deltas("Hi " + trigger[:-1] + "~", final=True)
    assert piece == " " + trigger[:-1] + "~" and deltas == []


def test_the_json_fallback_keeps_vllm_s_shapes() -> None:
    """No format known: ``required`` is a JSON array of calls, a named tool its arguments."""
    required = _calls(None, "required")
    assert json.loads(str(required.guide().guide))["type"] == "array"
    text = json.dumps([{"name": n, "arguments": a} for n, a in (PARIS, THREE)])
    assert _read(required, text) == (None, [PARIS, THREE])
    named = _calls(None, NAMED)
    assert _read(named, json.dumps(PARIS[1])) == (None, [PARIS])


def test_auto_needs_the_flag_and_a_format() -> None:
    with pytest.raises(RequestError, match="--enable-auto-tool-choice") as info:
        tool_calls_for(TOOLS, "auto", parallel=True, parser="hermes", auto_enabled=False)
    assert info.value.param == "tool_choice"
    with pytest.raises(RequestError, match="--enable-auto-tool-choice"):
        tool_calls_for(TOOLS, None, parallel=True, parser=None, auto_enabled=True)
    assert tool_calls_for(TOOLS, "none", parallel=True, parser="hermes", auto_enabled=True) is None
    settings = ToolSettings(enable_auto=False)
    assert (
        settings.for_request(TOOLS, None, parallel=True, template=None, guided_otherwise=True)
        is None
    )
    with pytest.raises(ValueError, match="unknown tool-call parser 'hermez'"):
        ToolSettings(parser="hermez")


def test_strict_tools_close_their_objects() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
        "$defs": {"X": {"type": "object", "properties": {"y": {}}, "additionalProperties": True}},
    }
    closed = close_every_object(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["X"]["additionalProperties"] is True  # given: kept
    strict = [{"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}]
    loose = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    for tools, expected in ((strict, False), (loose, None)):
        calls = tool_calls_for(
            tools, "required", parallel=True, parser="hermes", auto_enabled=False
        )
        assert calls is not None
        assert calls.schemas["f"].get("additionalProperties") is expected


def test_the_engine_s_option_closes_every_tool_s_objects() -> None:
    """``close_objects`` (the engine's ``disable_additional_properties``, on by default) closes
    a tool's arguments without ``strict``; a tool whose objects combine (``allOf``) is left."""
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}}
    combined = {"allOf": [plain, {"type": "object", "properties": {"b": {}}}]}
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": plain}},
        {"type": "function", "function": {"name": "g", "parameters": combined}},
    ]
    for close, expected in ((True, False), (False, None)):
        calls = ToolSettings(close_objects=close).for_request(
            tools, "required", parallel=True, template=None
        )
        assert calls is not None
        assert calls.schemas["f"].get("additionalProperties") is expected
        assert calls.schemas["g"] == combined


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, "hermes"),
        ("{{ messages }}", "hermes"),  # renders no tools: guidedec writes them as hermes text
        ("{{ tools }}{{ tool_calls }}<tool_call>", "hermes"),
        ("{{ tools }}{{ tool_calls }}[TOOL_CALLS]", "mistral"),
        ("{{ tools }}{{ tool_calls }}<|python_tag|>", "llama3_json"),
        ("{{ tools }}{{ tool_calls }}[func_name1(params_name1=params_value1)]", "pythonic"),
        ("{{ tools }}{{ tool_calls }}<|tool|>", None),
    ],
)
def test_the_format_is_told_from_the_chat_template(
    template: str | None, expected: str | None
) -> None:
    assert detect_parser(template) == expected


def test_the_cli_offers_every_format() -> None:
    assert tuple(sorted(TOOL_PARSERS)) == TOOL_CALL_PARSERS


def test_arguments_that_are_no_json_come_back_as_written() -> None:
    assert new_call("f", '{"a":  1}')["function"]["arguments"] == '{"a": 1}'
    assert new_call("f", '{"a": tru')["function"]["arguments"] == '{"a": tru'
    assert new_call("f", "")["function"]["arguments"] == "{}"
    assert new_call("f", "{}")["id"] != new_call("f", "{}")["id"]
