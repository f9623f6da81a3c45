"""A chat request's tool calling: its tools, its ``tool_choice`` and the server's tool-call
format, as the guide of the output and the reading of ``tool_calls`` back out of it.

The format is the server's ``--tool-call-parser``, or else the one the chat template teaches
(:func:`detect_parser`). ``auto`` needs ``--enable-auto-tool-choice`` (vLLM's flag); the model
then writes freely and each call it starts is guided by its tool's schema. ``required`` and a
named tool are guided in the same format; with no format known they fall back to guidedec's
JSON (see :mod:`guidedec.server.structured`): an array of ``{"name", "arguments"}`` calls, or
the named tool's arguments object. A tool with ``"strict": true`` has its arguments held to a
closed schema: every object admits only the properties it names.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from guidedec.engine.chat import renders_tools
from guidedec.grammar.closed_objects import close_every_object, close_objects
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.server.structured import (
    RequestError,
    chosen_tool,
    required_calls_schema,
    tool_schemas,
)
from guidedec.server.tool_parsers import (
    PARSERS,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    Piece,
    ToolParser,
    content_and_calls,
)
from guidedec.server.tool_pythonic import PythonicParser
from guidedec.server.tool_scan import scan_calls

TOOL_PARSERS: dict[str, type[ToolParser]] = {**PARSERS, PythonicParser.name: PythonicParser}
"""The ``--tool-call-parser`` names, vLLM's."""
AUTO_NEEDS = (
    '"auto" tool choice requires --enable-auto-tool-choice, and a --tool-call-parser '
    "(or a chat template it can be told from)"
)


def detect_parser(template: str | None) -> str | None:
    """The tool-call format a chat template teaches: ``hermes`` for one that renders no tools
    (guidedec then writes them as text in that format), else by the marks it writes; None
    when it shows none."""
    if not template or not renders_tools(template):
        return HermesParser.name
    if "[TOOL_CALLS]" in template:
        return MistralParser.name
    if "<tool_call>" in template:
        return HermesParser.name
    if re.search(r"\[\s*func_name\w*\(", template):
        return PythonicParser.name
    if "<|python_tag|>" in template or '"parameters"' in template:
        return Llama3JsonParser.name
    return None


@dataclass(frozen=True)
class ToolCalls:
    """What one request asks of its output's tool calls."""

    schemas: dict[str, dict[str, Any]]
    choice: str  # "auto", "required" or the named tool
    parallel: bool
    parser: ToolParser | None  # None: guidedec's JSON

    @property
    def named(self) -> bool:
        return self.choice in self.schemas

    def guide(self) -> GuidedDecodingParams:
        if self.parser is not None:
            tag = self.parser.guide(self.schemas, self.choice, parallel=self.parallel)
            return GuidedDecodingParams(structural_tag={"type": "structural_tag", "format": tag})
        if self.named:
            return GuidedDecodingParams(json_schema=self.schemas[self.choice])
        schema = required_calls_schema(self.schemas)
        return GuidedDecodingParams(json_schema=schema | ({} if self.parallel else {"maxItems": 1}))

    def scan(self, text: str) -> list[Piece]:
        """The output so far as text and calls."""
        if self.parser is not None:
            return self.parser.scan(text)
        if self.named:
            return [Piece(text, True, self.choice, text, closed=_is_json(text))]
        calls = scan_calls(text)
        return [Piece("", True, name, args, _is_json(args)) for name, args in calls]

    def message(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The assistant message's ``content`` and ``tool_calls`` (OpenAI's shape)."""
        content, calls = content_and_calls(self.scan(text))
        if self.parser is None and calls:
            content = None
        return content, [new_call(name, arguments) for name, arguments in calls]

    def finish_reason(self, reason: str, num_calls: int) -> str:
        """OpenAI's: ``tool_calls`` where calls end the output, ``stop`` for a named tool."""
        if reason == "stop" and num_calls and not self.named:
            return "tool_calls"
        return reason


def new_call(name: str, arguments: str) -> dict[str, Any]:
    """An OpenAI tool call, its arguments as compact JSON text (as written where they are no
    JSON: a guide makes them JSON, text cut by a ``stop`` string may not be)."""
    text = arguments or "{}"
    if _is_json(text):
        text = json.dumps(json.loads(text), ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ToolSettings:
    """The server's tool-call flags: vLLM's ``--enable-auto-tool-choice`` and
    ``--tool-call-parser`` (None: the chat template's format); ``close_objects``: the engine's
    ``disable_additional_properties``, which closes the arguments' objects of every tool (see
    :mod:`guidedec.grammar.closed_objects`), not only those of ``strict`` tools.

    Raises:
        ValueError: an unknown parser name.
    """

    enable_auto: bool = False
    parser: str | None = None
    close_objects: bool = False

    def __post_init__(self) -> None:
        if self.parser is not None and self.parser not in TOOL_PARSERS:
            names = ", ".join(TOOL_PARSERS)
            raise ValueError(f"unknown tool-call parser {self.parser!r}; choose one of {names}")

    def for_request(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: str | Mapping[str, Any] | None,
        *,
        parallel: bool,
        template: str | None,
        guided_otherwise: bool = False,
    ) -> ToolCalls | None:
        """The request's :class:`ToolCalls` (see :func:`tool_calls_for`), read in the server's
        format or else ``template``'s. ``guided_otherwise``: another field guides the output
        (``response_format``...), so a ``tool_choice`` left out means ``"none"``."""
        if tool_choice is None and guided_otherwise:
            tool_choice = "none"
        parser = self.parser or detect_parser(template)
        return tool_calls_for(
            tools,
            tool_choice,
            parallel=parallel,
            parser=parser,
            auto_enabled=self.enable_auto,
            close_all=self.close_objects,
        )


def tool_calls_for(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    *,
    parallel: bool,
    parser: str | None,
    auto_enabled: bool,
    close_all: bool = False,
) -> ToolCalls | None:
    """The request's :class:`ToolCalls`, or None when its output is not about tools
    (``"none"``, or no tools). ``tool_choice`` absent with tools means ``"auto"`` (OpenAI's
    default). ``parser``: the format's name, None for guidedec's JSON. ``close_all``:
    every tool's objects closed (:func:`guidedec.grammar.closed_objects.close_objects`), as the
    engine's ``disable_additional_properties``; a ``strict`` tool's are closed regardless.

    Raises:
        RequestError: malformed tools or choice; ``"auto"`` without ``auto_enabled`` or a
            parser.
    """
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    named = tool_schemas(tools) if tools is not None else {}
    chosen = chosen_tool(tool_choice, named)
    if tool_choice == "none":
        return None
    if tool_choice == "auto" and not (auto_enabled and parser):
        raise RequestError(AUTO_NEEDS, "tool_choice")
    strict = {
        name: close_every_object(schema)
        if _is_strict(tools, name)
        else close_objects(schema)
        if close_all
        else schema
        for name, schema in named.items()
    }
    choice = chosen if chosen is not None else str(tool_choice)
    instance = TOOL_PARSERS[parser](list(named)) if parser else None
    return ToolCalls(strict, choice, parallel, instance)


def _is_strict(tools: Sequence[Mapping[str, Any]] | None, name: str) -> bool:
    for tool in tools or ():
        function = tool.get("function") or {}
        if function.get("name") == name:
            return function.get("strict") is True
    return False
