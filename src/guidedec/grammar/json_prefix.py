"""What a prefix of a JSON text has settled: its complete values, and the one still open.

A guided JSON output is written left to right; once a value's last character is out (a
string's closing quote, a container's bracket, the delimiter after a number or a literal), no
later token changes it. :func:`scan_prefix` reads a prefix and returns

- ``closed``: the prefix cut back to its complete values, with its open containers closed (a
  member whose value is unfinished is left out), as JSON text; and
- ``open_path``: the path (keys and indices) of the value still being written, from the top;
  None once the top-level value is complete.

A value of ``closed`` at a path that is not a prefix of ``open_path`` is exactly the value the
finished output will hold there, whatever follows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_WHITESPACE = " \t\n\r"
_SCALAR_END = _WHITESPACE + ",]}:"


@dataclass(slots=True)
class JsonPrefix:
    """The settled part of a JSON prefix (see the module's docstring)."""

    closed: str | None  # None while the top-level value is an unfinished scalar (or nothing)
    open_path: tuple[str | int, ...] | None


@dataclass(slots=True)
class _Frame:
    is_object: bool
    cut: int  # end of the last complete member (just after the bracket at first)
    key: str | int | None = None  # the member being written
    pending: bool = False  # a member is being written (its key is out, or its value started)
    expect_key: bool = True  # objects: the next string is a key
    count: int = 0  # arrays: complete elements


def scan_prefix(text: str) -> JsonPrefix:
    """Read ``text``, the beginning of one JSON value (whitespace allowed around tokens)."""
    return _Scanner(text).scan()


class _Scanner:
    """One left-to-right read of a prefix: the open containers (``frames``), and where the
    top-level value ended (``end``)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.frames: list[_Frame] = []
        self.end: int | None = None  # where the top-level value ended

    def scan(self) -> JsonPrefix:
        text, frames = self.text, self.frames
        in_string = is_key = scalar = False
        start = i = 0
        n = len(text)
        while i < n and self.end is None:
            ch = text[i]
            if in_string:
                if ch == "\\":
                    i += 2
                    continue
                if ch == '"':
                    in_string = False
                    if is_key:
                        top = frames[-1]
                        top.key, top.pending, top.expect_key = (
                            _key(text[start : i + 1]),
                            True,
                            False,
                        )
                    else:
                        self.value_done(i + 1)
                i += 1
                continue
            if scalar and ch in _SCALAR_END:
                scalar = False
                self.value_done(i)
                if self.end is not None:
                    break
            if ch == '"':
                in_string, start = True, i
                is_key = bool(frames) and frames[-1].is_object and frames[-1].expect_key
                if not is_key:
                    self.value_start()
            elif ch in "{[":
                self.value_start()
                frames.append(_Frame(is_object=ch == "{", cut=i + 1))
            elif ch in "}]":
                if not frames:
                    break
                frames.pop()
                self.value_done(i + 1)
            elif ch == ",":
                if frames and frames[-1].is_object:
                    frames[-1].expect_key = True
            elif ch not in _WHITESPACE and ch != ":" and not scalar:
                scalar = True
                self.value_start()
            i += 1
        return self.result()

    def value_start(self) -> None:
        if self.frames:
            top = self.frames[-1]
            if not top.is_object:
                top.key = top.count
            top.pending = True

    def value_done(self, at: int) -> None:
        if not self.frames:
            self.end = at
            return
        top = self.frames[-1]
        top.cut, top.pending = at, False
        if not top.is_object:
            top.count += 1

    def result(self) -> JsonPrefix:
        frames = self.frames
        if self.end is not None:
            return JsonPrefix(self.text[: self.end], None)
        if not frames:
            return JsonPrefix(None, ())
        path = [f.key for f in frames[:-1]]
        if frames[-1].pending:
            path.append(frames[-1].key)
        closers = "".join("}" if f.is_object else "]" for f in reversed(frames))
        cut = frames[-1].cut
        return JsonPrefix(self.text[:cut] + closers, tuple(p for p in path if p is not None))


def _key(quoted: str) -> str:
    try:
        key = json.loads(quoted)
    except ValueError:
        return quoted[1:-1]
    return key if isinstance(key, str) else quoted[1:-1]
