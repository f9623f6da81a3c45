"""Tool calls streamed as they are generated: OpenAI's ``delta.tool_calls`` chunks, each with
its ``index``, the call's ``id``, ``type`` and ``function.name`` first, then its
``function.arguments`` piece by piece.

The output is the guide's (see :mod:`guidedec.server.structured`): for a named tool, its
arguments object alone; for ``"required"``, a JSON array of ``{"name": ..., "arguments": ...}``
objects, keys in that order. The scanner reads the text so far, so a call's name is sent once
its string is closed and its arguments as far as they have come.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*')


def value_end(text: str, start: int) -> int | None:
    """The index after the JSON object or array that starts at ``text[start]``; None while it
    is not closed yet."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def scan_calls(text: str) -> list[tuple[str, str]]:
    """``(name, arguments so far)`` of each call of a ``"required"`` output seen so far."""
    calls, pos = [], 0
    while (name := _NAME.search(text, pos)) is not None:
        try:
            tool = str(json.loads(f'"{name.group(1)}"'))
        except json.JSONDecodeError:
            break
        arguments = _ARGUMENTS.match(text, name.end())
        if arguments is None:
            calls.append((tool, ""))
            break
        end = value_end(text, arguments.end())
        calls.append((tool, text[arguments.end() : end]))
        if end is None:
            break
        pos = end
    return calls


class ToolCallStream:
    """Turns the growing text of a tool-constrained output into ``tool_calls`` deltas."""

    def __init__(self, named_tool: str | None) -> None:
        self.named_tool = named_tool  # tool_choice names one tool: the text is its arguments
        self._sent: list[int] = []  # argument characters sent, per call
        self._ids: list[str] = []

    @property
    def num_calls(self) -> int:
        return len(self._sent)

    def deltas(self, text: str) -> list[dict[str, Any]]:
        """The ``tool_calls`` entries that ``text`` (the whole output so far) adds."""
        calls = [(self.named_tool, text)] if self.named_tool is not None else scan_calls(text)
        out: list[dict[str, Any]] = []
        for index, (name, arguments) in enumerate(calls):
            if index == len(self._sent):
                self._sent.append(0)
                self._ids.append(f"call_{uuid.uuid4().hex[:24]}")
                head = {"name": name, "arguments": ""}
                out.append({"index": index, "id": self._ids[index], "type": "function"})
                out[-1]["function"] = head
            piece = arguments[self._sent[index] :]
            if piece:
                self._sent[index] = len(arguments)
                out.append({"index": index, "function": {"arguments": piece}})
        return out
