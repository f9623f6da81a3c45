"""Tool calls in the formats models were trained on: the guide that makes a model write them
exactly, and the reading of them back out of its text (vLLM's ``--tool-call-parser`` names).

======================  =====================================================================
``hermes``              ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one
                        block per call (Qwen, Hermes, and guidedec's tools-as-text prompt)
``llama3_json``         ``{"name": "f", "parameters": {...}}``, calls joined by ``; ``
``mistral``             ``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]``
``pythonic``            ``[f(a=1, b="x"), g()]`` (Llama 3.2 and 4)
======================  =====================================================================

Each format guides three choices (xgrammar structural tags, so both backends run them):
``auto`` lets the model write text and, once it writes a call's opening (its trigger), holds
the call to the tool's schema; ``required`` makes the output one or more calls; a named tool
makes it that tool's call. ``parallel=False`` allows one call.

Scanning reads text as it grows: the text between calls, and each call's name and arguments
so far (JSON text), so that a stream can send them as they come.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from guidedec.server.tool_scan import value_end

Schemas = Mapping[str, Mapping[str, Any]]
"""Each tool's name to its parameters schema."""


@dataclass(frozen=True)
class Piece:
    """A part of an output as written (``text``): free text, or one call (``call``) with its
    ``name`` once written out, its ``arguments`` as far as they have come (JSON text) and
    whether it has ended (``closed``)."""

    text: str
    call: bool = False
    name: str | None = None
    arguments: str = ""
    closed: bool = False


class ToolParser(ABC):
    """A tool-call format for a request's tools: its guide, and its scanner."""

    name: ClassVar[str]
    triggers: tuple[str, ...] = ()
    """Text that starts a call in free text; a stream holds back text that may be its start."""

    def __init__(self, tool_names: Sequence[str] = ()) -> None:
        self.tool_names = tuple(tool_names)

    @abstractmethod
    def guide(self, tools: Schemas, choice: str, *, parallel: bool) -> dict[str, Any]:
        """The structural tag (xgrammar's ``format``) of ``choice``: ``"auto"``,
        ``"required"`` or a tool's name."""

    @abstractmethod
    def scan(self, text: str) -> list[Piece]:
        """The output so far as text and calls, in order; their texts make up ``text``."""

    separator: ClassVar[str] = ""
    """Text between two calls (not content)."""

    def hold_back(self, text: str, *, after_call: bool = False) -> int:
        """How many characters at the end of ``text`` may start a trigger, or (``after_call``:
        all of ``text`` follows a call) a separator before another call: not sent yet."""
        if after_call:
            rest, separator = text.lstrip(), self.separator.strip()
            if separator.startswith(rest):
                return len(text)
            rest = rest[len(separator) :].lstrip() if rest.startswith(separator) else rest
            if any(t.startswith(rest) for t in self.triggers):
                return len(text)
        for size in range(min(len(text), max(map(len, self.triggers), default=0)), 0, -1):
            if any(t.startswith(text[-size:]) for t in self.triggers):
                return size
        return 0


def json_content(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": dict(schema)}


def tag(begin: str, content: dict[str, Any], end: str) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def calls_guide(
    tags: list[dict[str, Any]], separator: str, triggers: Sequence[str], choice: str, parallel: bool
) -> dict[str, Any]:
    """``required``: one or more of ``tags`` joined by ``separator``; ``auto``: free text in
    which a trigger starts one of them."""
    if choice == "required":
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": separator,
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    return {
        "type": "triggered_tags",
        "triggers": list(triggers),
        "tags": tags,
        "stop_after_first": not parallel,
    }


class _ObjectCalls(ToolParser):
    """Formats whose calls are JSON objects ``{"name": "f", "<key>": {...}}`` (``key``
    ``arguments`` or ``parameters``), each after ``opening`` and before ``closing``; the
    first trigger starts a call."""

    key: ClassVar[str] = "arguments"
    opening: ClassVar[str] = ""
    closing: ClassVar[str] = ""

    def call_tag(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        begin = f'{self.opening}{{"name": {json.dumps(name)}, "{self.key}": '
        return tag(begin, json_content(schema), "}" + self.closing)

    def guide(self, tools: Schemas, choice: str, *, parallel: bool) -> dict[str, Any]:
        if choice in tools:
            return self.call_tag(choice, tools[choice])
        tags = [self.call_tag(name, schema) for name, schema in tools.items()]
        return calls_guide(tags, self.separator, self.triggers, choice, parallel)

    def scan(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        pos, trigger = 0, self.triggers[0]
        skip = len(trigger) if self.opening else 0  # the object starts after the opening
        while (start := text.find(trigger, pos)) >= 0:
            found, between = start + skip, text[pos:start]
            if pieces and pieces[-1].call and between.strip() == self.separator.strip():
                start = pos  # the separator goes with the call after it
            elif start > pos:
                pieces.append(Piece(between))
            call, pos = read_object_call(text, start, found, self.closing)
            pieces.append(call)
            if not call.closed:
                return pieces
        if pos < len(text):
            pieces.append(Piece(text[pos:]))
        return pieces


_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)(")?')
_KEY = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_END = re.compile(r"\s*\}")


def read_object_call(text: str, start: int, pos: int, closing: str) -> tuple[Piece, int]:
    """The call that starts at ``text[start]``, its object ``{"name": ..., "arguments": ...}``
    at ``text[pos]`` (after whitespace), then ``closing``: the call so far, and where the text
    after it starts."""

    def so_far(name: str | None = None, arguments: str = "") -> tuple[Piece, int]:
        return Piece(text[start:], call=True, name=name, arguments=arguments), len(text)

    found = _NAME.match(text, pos)
    if found is None or found.group(2) is None:  # the name is not written out yet
        return so_far()
    name = str(json.loads(f'"{found.group(1)}"'))
    key = _KEY.match(text, found.end())
    if key is None:
        return so_far(name)
    end = value_end(text, key.end())
    arguments = text[key.end() : end]
    brace = None if end is None else _END.match(text, end)
    if brace is None:
        return so_far(name, arguments)
    after = brace.end()
    if closing:
        gap = len(text[after:]) - len(text[after:].lstrip())
        if not text.startswith(closing.lstrip(), after + gap):
            return so_far(name, arguments)
        after += gap + len(closing.lstrip())
    return Piece(text[start:after], True, name, arguments, closed=True), after


class HermesParser(_ObjectCalls):
    name = "hermes"
    triggers = ("<tool_call>",)
    opening = "<tool_call>\n"
    closing = "\n</tool_call>"
    separator = "\n"


class Llama3JsonParser(_ObjectCalls):
    name = "llama3_json"
    triggers = ('{"name": "',)
    key = "parameters"
    separator = "; "


class _MistralCall(_ObjectCalls):
    name = "mistral-call"


class MistralParser(ToolParser):
    name = "mistral"
    triggers = ("[TOOL_CALLS]",)
    opening = "[TOOL_CALLS]["

    def guide(self, tools: Schemas, choice: str, *, parallel: bool) -> dict[str, Any]:
        calls = _MistralCall(self.tool_names)
        if choice in tools:
            return tag(self.opening, calls.call_tag(choice, tools[choice]), "]")
        listed = [calls.call_tag(name, schema) for name, schema in tools.items()]
        whole = tag(self.opening, calls_guide(listed, ", ", (), "required", parallel), "]")
        if choice == "required":
            return whole
        return calls_guide([whole], "", self.triggers, "auto", False)

    def scan(self, text: str) -> list[Piece]:
        start = text.find(self.triggers[0])
        if start < 0:
            return [Piece(text)] if text else []
        pieces = [Piece(text[:start])] if start else []
        opened = _OPEN_LIST.match(text, start + len(self.triggers[0]))
        pos = len(text) if opened is None else opened.end()
        first = start
        while True:
            call, pos = read_object_call(text, first, pos, "")
            pieces.append(call)
            if not call.closed:
                return pieces
            first = pos
            more = _COMMA.match(text, pos)
            if more is None:
                break
            pos = more.end()
        ended = _CLOSE_LIST.match(text, pos)
        if ended is None:  # the list is not closed yet: the rest belongs to it
            return pieces + ([Piece(text[pos:], call=True)] if pos < len(text) else [])
        pieces[-1] = Piece(
            pieces[-1].text + text[pos : ended.end()],
            True,
            pieces[-1].name,
            pieces[-1].arguments,
            closed=True,
        )
        return pieces + ([Piece(text[ended.end() :])] if ended.end() < len(text) else [])


_OPEN_LIST = re.compile(r"\s*\[")
_COMMA = re.compile(r"\s*,")
_CLOSE_LIST = re.compile(r"\s*\]")

PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser for parser in (HermesParser, Llama3JsonParser, MistralParser)
}


def content_and_calls(pieces: Sequence[Piece]) -> tuple[str | None, list[tuple[str, str]]]:
    """The text outside the calls, a call that never ended included (None when only
    whitespace is left beside calls), and each ended call's name and arguments (JSON text)."""
    calls = [(p.name or "", p.arguments) for p in pieces if p.call and p.closed]
    text = "".join(p.text for p in pieces if not (p.call and p.closed))
    if calls:
        return text.strip() or None, calls
    return text or None, calls
