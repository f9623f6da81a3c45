"""guidedec's own JSON tool-call format read as it grows: a ``"required"`` output is a JSON
array of ``{"name": ..., "arguments": ...}`` objects, keys in that order; and where a JSON value
that has begun ends."""

from __future__ import annotations

import json
import re

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
