"""The EBNF lexer: xgrammar 0.2.9's token rules (strings, character classes, escapes, rule
attributes), plus the GBNF name ``.``. Rule names are marked here: a name directly before
``::=``, which must start its line."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from guidedec.grammar.convert.ebnf_ast import MAX_CODEPOINT, CharClass

_ESCAPES = {"'": 39, '"': 34, "?": 63, "\\": 92, "/": 47, "0": 0}
_ESCAPES.update({"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "e": 27})
_CLASS_ESCAPES = {c: ord(c) for c in "^$\\.*+?()[]{}|/-"}
_CLASS_SHORTHANDS = "dDsSwW"
_PUNCT = {c: c for c in "(){}|,*+?="}
_ATTRIBUTE = r'(?:max_tokens[ \t]*=[ \t]*\d{1,10}|capture(?:[ \t]*=[ \t]*"[^"\\\r\n]+")?)'
_ATTRIBUTES = re.compile(
    rf"\[[ \t]*({_ATTRIBUTE}(?:[ \t]*,[ \t]*{_ATTRIBUTE})*)[ \t]*\](?=[ \t]*::=)"
)


@dataclass(frozen=True, slots=True)
class Token:
    """One lexeme, with the line and column (both from 1) where it starts."""

    kind: str  # punctuation itself, or: "(=", "::=", str, class, ident, rule, int, eof
    value: Any
    line: int
    col: int


def _is_name_char(c: str, *, first: bool) -> bool:
    if not c.isascii():
        return False
    return c in "_-." or c.isalpha() or (not first and c.isdigit())


class Lexer:
    """Cuts EBNF text into :class:`Token` s; errors name the line and column reached."""

    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line, self.col = text, 0, 1, 1

    def error(self, message: str) -> ValueError:
        return ValueError(f"EBNF syntax error at line {self.line}, column {self.col}: {message}")

    def peek(self, delta: int = 0) -> str:
        i = self.pos + delta
        return self.text[i] if i < len(self.text) else ""

    def advance(self, count: int = 1) -> None:
        for _ in range(count):
            c = self.peek()
            if c == "\n" or (c == "\r" and self.peek(1) != "\n"):
                self.line, self.col = self.line + 1, 1
            else:
                self.col += 1
            self.pos += 1

    def skip_space(self) -> None:
        while self.peek() and self.peek() in " \t\r\n#":
            if self.peek() == "#":
                while self.peek() and self.peek() not in "\r\n":
                    self.advance()
            self.advance()

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        while True:
            self.skip_space()
            line, col, c = self.line, self.col, self.peek()
            if not c:
                out.append(Token("eof", None, line, col))
                return _mark_rule_names(out)
            kind, value = self.next_token(c)
            out.append(Token(kind, value, line, col))

    def next_token(self, c: str) -> tuple[str, Any]:
        if c == "(" and self.peek(1) == "=":
            self.advance(2)
            return "(=", None
        if c in _PUNCT:
            self.advance()
            return c, None
        if c == ":" and self.peek(1) == ":" and self.peek(2) == "=":
            self.advance(3)
            return "::=", None
        if c == '"':
            return "str", self.string()
        if c == "[":
            return "class", self.char_class()
        if _is_name_char(c, first=True):
            return "ident", self.identifier()
        if c.isascii() and c.isdigit():
            start = self.pos
            while self.peek().isascii() and self.peek().isdigit():
                self.advance()
            return "int", int(self.text[start : self.pos])
        raise self.error(f"unexpected character {c!r}")

    def identifier(self) -> tuple[str, str]:
        start = self.pos
        while self.peek() and _is_name_char(self.peek(), first=self.pos == start):
            self.advance()
        name = self.text[start : self.pos]
        attributes = _ATTRIBUTES.match(self.text, self.pos)
        if attributes is None:
            return name, ""
        self.advance(attributes.end() - self.pos)
        return name, attributes.group(1)

    def string(self) -> str:
        self.advance()
        chars: list[str] = []
        while self.peek() and self.peek() not in '"\r\n':
            chars.append(chr(self.codepoint(_ESCAPES)))
        if self.peek() != '"':
            raise self.error('unterminated string literal (expected ")')
        self.advance()
        return "".join(chars)

    def codepoint(self, escapes: Mapping[str, int]) -> int:
        c = self.peek()
        if c != "\\":
            self.advance()
            return _checked_codepoint(ord(c), self)
        e = self.peek(1)
        if e in escapes:
            self.advance(2)
            return escapes[e]
        digits = ""
        if e == "x":
            while re.match(r"[0-9a-fA-F]", self.peek(2 + len(digits))):
                digits += self.peek(2 + len(digits))
        elif e in "uU":
            digits = self.text[self.pos + 2 : self.pos + (6 if e == "u" else 10)]
            if not re.fullmatch(r"[0-9a-fA-F]{4}" if e == "u" else r"[0-9a-fA-F]{8}", digits):
                digits = ""
        if not digits:
            raise self.error(f"invalid escape sequence \\{e}")
        self.advance(2 + len(digits))
        return _checked_codepoint(int(digits, 16), self)

    def char_class(self) -> CharClass:
        self.advance()
        negated = self.peek() == "^"
        if negated:
            self.advance()
        items: list[int | None] = []  # None: a dash that may form a range
        while self.peek() != "]":
            c = self.peek()
            if not c:
                raise self.error("unterminated character class")
            if c in "\r\n":
                raise self.error("character class contains a newline")
            if c == "-":
                self.advance()
                items.append(None)
            elif c == "\\" and self.peek(1) and self.peek(1) in _CLASS_SHORTHANDS:
                raise self.error(f"character class escape \\{self.peek(1)} is not supported")
            else:
                items.append(self.codepoint({**_CLASS_ESCAPES, **_ESCAPES}))
        self.advance()
        return CharClass(_class_ranges(items, self), negated)


def _checked_codepoint(cp: int, lexer: Lexer) -> int:
    if cp > MAX_CODEPOINT:
        raise lexer.error(f"code point {cp:#x} is beyond U+10FFFF")
    if 0xD800 <= cp <= 0xDFFF:
        raise lexer.error(f"surrogate code point {cp:#x} is not a character")
    return cp


def _class_ranges(items: list[int | None], lexer: Lexer) -> tuple[tuple[int, int], ...]:
    """xgrammar's rule: ``x-y`` is a range when both ends exist; other dashes are literal."""
    dash = ord("-")
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(items):
        first = items[i]
        lo = dash if first is None else first
        if i + 2 < len(items) and items[i + 1] is None:
            last = items[i + 2]
            hi = dash if last is None else last
            if lo > hi:
                raise lexer.error("character class range has lower bound above upper bound")
            ranges.append((lo, hi))
            i += 3
        else:
            ranges.append((lo, lo))
            i += 1
    return tuple(ranges)


def _mark_rule_names(tokens: list[Token]) -> list[Token]:
    """An identifier directly before ``::=`` names a rule; it must start its line."""
    out = list(tokens)
    for i, tok in enumerate(tokens):
        if tok.kind != "::=":
            continue
        where = f"line {tok.line}, column {tok.col}"
        if i == 0 or tokens[i - 1].kind != "ident":
            raise ValueError(f"EBNF syntax error at {where}: '::=' must follow a rule name")
        name = tokens[i - 1]
        if i >= 2 and tokens[i - 2].line == name.line:
            raise ValueError(
                f"EBNF syntax error at line {name.line}, column {name.col}: "
                f"rule name {name.value[0]!r} must start a line"
            )
        out[i - 1] = Token("rule", name.value, name.line, name.col)
    return out
