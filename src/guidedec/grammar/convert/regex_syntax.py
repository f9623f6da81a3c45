"""Reading a regular expression as Python's ``re`` reads it, for the rewriters of ``regex``.

The pattern becomes a flat list of tokens: escapes and character classes as whole tokens (a class
parsed into its members and ranges), groups, alternatives, anchors, quantifiers and characters.
What no backend may read differently is refused here: possessive quantifiers, the verbose flag
``(?x)``, class escapes bounding a range, and ``^``/``$`` where something can come before/after.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_HEX = "0123456789abcdefABCDEF"
OCTAL = "01234567"
_COUNTED = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")
_FLAG_GROUP = re.compile(r"\(\?([A-Za-z-]*)([:)])")
_SIMPLE_KINDS = {
    **{"(": "open", ")": "close", "|": "alt", "^": "caret", "$": "dollar", ".": "dot"},
    **{"*": "quantifier", "+": "quantifier", "?": "quantifier"},
}


@dataclass(frozen=True, slots=True)
class ClassItem:
    """A member of a character class: one atom (a character or an escape), or ``low-high``."""

    low: str
    high: str | None = None


@dataclass(frozen=True, slots=True)
class Token:
    """A piece of the pattern. ``kind``: open, close, alt, caret, dollar, dot, escape, class,
    quantifier (``*``, ``+``, ``?``, ``{m,n}``), flags (a ``(?i)`` group) or char."""

    kind: str
    text: str
    items: tuple[ClassItem, ...] = ()  # of a class
    negated: bool = False  # a class ``[^...]``


def read_pattern(pattern: str) -> list[Token]:
    """The tokens of ``pattern``.

    Raises:
        ValueError: the pattern is malformed, or uses a construct refused on every backend.
    """
    tokens: list[Token] = []
    i = 0
    while i < len(pattern):
        token, i = _next_token(pattern, i)
        if token.text == "+" and tokens and tokens[-1].kind == "quantifier":
            raise ValueError("possessive quantifiers (a*+, a++) are not supported")
        tokens.append(token)
    _check_anchors(tokens)
    return tokens


def is_class_escape(atom: str) -> bool:
    """Whether ``atom`` is one of ``\\d \\D \\w \\W \\s \\S``."""
    return len(atom) == 2 and atom[0] == "\\" and atom[1] in "dDwWsS"


def _next_token(pattern: str, i: int) -> tuple[Token, int]:
    char = pattern[i]
    if char == "\\":
        end = _atom_end(pattern, i, in_class=False)
        return Token("escape", pattern[i:end]), end
    if char == "[":
        return _read_class(pattern, i)
    if pattern.startswith("(?", i):
        return _read_group_start(pattern, i)
    if char == "{":
        return _read_counted(pattern, i)
    return Token(_SIMPLE_KINDS.get(char, "char"), char), i + 1


def _read_group_start(pattern: str, i: int) -> tuple[Token, int]:
    """``(?:``, ``(?i:`` or ``(?i)``; other ``(?`` groups are left to the backend."""
    match = _FLAG_GROUP.match(pattern, i)
    if match is None:
        return Token("open", "(?"), i + 2
    if "x" in match[1]:
        raise ValueError("the verbose flag (?x) is not supported")
    return Token("flags" if match[2] == ")" else "open", match[0]), match.end()


def _read_counted(pattern: str, i: int) -> tuple[Token, int]:
    """``{m,n}`` as Python reads it (``{,n}`` is ``{0,n}``), or else a literal ``{``."""
    match = _COUNTED.match(pattern, i)
    if match is None or match[0] == "{}":
        return Token("escape", "\\{"), i + 1
    low, comma, high = match[1] or "0", match[2] or "", match[3] or ""
    return Token("quantifier", f"{{{low}{comma}{high}}}"), match.end()


def _read_class(pattern: str, start: int) -> tuple[Token, int]:
    """The class ``[...]`` at ``start``, parsed as Python's ``re`` parses it."""
    i = start + 1
    negated = pattern.startswith("^", i)
    i += negated
    items: list[ClassItem] = []
    while i == len(pattern) or pattern[i] != "]" or not items:  # "]" first is a character
        if i == len(pattern):
            raise ValueError(f"unterminated character class at position {start}")
        low_end = _atom_end(pattern, i, in_class=True)
        if pattern.startswith("-", low_end) and pattern[low_end + 1 : low_end + 2] not in ("", "]"):
            high_end = _atom_end(pattern, low_end + 1, in_class=True)
            items.append(_range(pattern[i:low_end], pattern[low_end + 1 : high_end]))
            i = high_end
        else:
            items.append(ClassItem(pattern[i:low_end]))
            i = low_end
    return Token("class", pattern[start : i + 1], tuple(items), negated), i + 1


def _range(low: str, high: str) -> ClassItem:
    if is_class_escape(low) or is_class_escape(high):
        raise ValueError(f"bad character range {low}-{high}: a class escape cannot bound a range")
    return ClassItem(low, high)


def _atom_end(pattern: str, i: int, *, in_class: bool) -> int:
    """The end of the character or escape sequence at ``pattern[i]``."""
    if pattern[i] != "\\":
        return i + 1
    if i + 1 == len(pattern):
        raise ValueError("the pattern ends with a lone backslash")
    kind, j = pattern[i + 1], i + 2
    if kind in "xuUpPN" and pattern.startswith("{", j):
        close = pattern.find("}", j)
        if close < 0:
            raise ValueError(f"unterminated escape at position {i}")
        return close + 1
    if kind in "xuU":
        digits = {"x": 2, "u": 4, "U": 8}[kind]
        end = _run_end(pattern, j, _HEX, digits)
        if end - j < digits:
            raise ValueError(f"incomplete escape {pattern[i:end]}: \\{kind} takes {digits} digits")
        return end
    if kind in "pPc":
        return j + (pattern[j : j + 1].isalpha())
    if kind == "0" or (in_class and kind in OCTAL):
        return _run_end(pattern, j, OCTAL, 2)
    if kind in OCTAL and _run_end(pattern, j, OCTAL, 2) == j + 2:  # \ddd: octal
        return j + 2
    return _run_end(pattern, j, "0123456789", 1) if kind.isdigit() else j  # a group number


def _run_end(pattern: str, j: int, alphabet: str, most: int) -> int:
    end = j
    while end < len(pattern) and end - j < most and pattern[end] in alphabet:
        end += 1
    return end


# --- Anchors -------------------------------------------------------------------------------------


def _check_anchors(tokens: Sequence[Token]) -> None:
    groups = _Groups(tokens)
    for i, token in enumerate(tokens):
        if token.kind == "caret" and not groups.nothing_before(i):
            raise ValueError("'^' is supported only where nothing can come before it")
        if token.kind == "dollar" and not groups.nothing_after(i):
            raise ValueError("'$' is supported only where nothing can come after it")


class _Groups:
    """Which group encloses each token, and where each group closes."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        self.tokens = tokens
        self.enclosing = [-1] * len(tokens)  # the innermost open group's "(" index, or -1
        self.close: dict[int, int] = {}  # "(" index -> ")" index
        stack: list[int] = []
        for i, token in enumerate(tokens):
            if token.kind == "close" and stack:
                self.close[stack.pop()] = i
            self.enclosing[i] = stack[-1] if stack else -1
            if token.kind == "open":
                stack.append(i)

    def nothing_before(self, i: int) -> bool:
        """Whether only group starts, alternatives and anchors precede token ``i`` on every path
        to it, with no repeated group around it."""
        j = i - 1
        while j >= 0:
            kind = self.tokens[j].kind
            if kind == "alt":
                j = self.enclosing[j]
            elif kind in ("caret", "flags") or (kind == "open" and not self._repeated(j)):
                j -= 1
            else:
                return False
        return True

    def nothing_after(self, i: int) -> bool:
        """Whether only group ends, alternatives and anchors follow token ``i``."""
        j = i + 1
        while j < len(self.tokens):
            kind = self.tokens[j].kind
            if kind == "alt":
                opening = self.enclosing[j]
                j = len(self.tokens) if opening < 0 else self.close.get(opening, len(self.tokens))
            elif kind in ("close", "dollar", "flags"):
                j += 1
            else:  # a quantifier after a ")" comes here too
                return False
        return True

    def _repeated(self, opening: int) -> bool:
        close = self.close.get(opening)
        if close is None or close + 1 == len(self.tokens):
            return False
        after = self.tokens[close + 1]
        return after.kind == "quantifier"
