"""Dialect conversion between guide types, so that one guide means the same on every backend.

Pure functions on text. Each raises ``ValueError`` naming the problem when its input is malformed
or uses a construct that cannot be carried over with the same meaning.

EBNF is read as xgrammar 0.2.9 reads it (the reference for the EBNF guide type), plus three GBNF
(llama.cpp) forms that xgrammar refuses and whose meaning is unambiguous: empty alternatives
(``ws ::= | " "``), ``.`` for any character (an undefined name made only of dots) and ``{,n}``.
:func:`normalize_ebnf` rewrites those for xgrammar; :func:`ebnf_to_lark` writes llguidance Lark.

llguidance lexes *greedily*: a lexeme ends only where no allowed lexeme can be extended, so
``num num`` with ``NUM: /[0-9]+/`` rejects ``"12"``, which a character-level CFG (xgrammar,
llama.cpp) accepts. The Lark written here therefore uses one-character lexemes for everything
that came from EBNF (the Earley parser then sees the character-level grammar exactly), and
multi-character lexemes only where greedy lexing provably cannot change the language: a whole
choice list, free text that runs to the end of the grammar, and free text bounded by delimiters
that cannot overlap (see :func:`structural_tag_to_lark`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

__all__ = [
    "choice_to_ebnf",
    "choice_to_lark",
    "ebnf_to_lark",
    "normalize_ebnf",
    "structural_tag_to_lark",
    "structural_tag_to_xgrammar_arg",
]

MAX_CODEPOINT = 0x10FFFF

# ----------------------------------------------------------------------------------------------
# EBNF syntax tree
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lit:
    """A literal string (may be empty)."""

    text: str


@dataclass(frozen=True, slots=True)
class CharClass:
    """One character in (or, negated, not in) the inclusive code point ranges."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Ref:
    name: str


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    """``item`` repeated ``lo`` to ``hi`` times (``hi is None``: unbounded)."""

    item: Node
    lo: int
    hi: int | None


Node: TypeAlias = Lit | CharClass | Ref | Seq | Alt | Repeat
ANY_CHAR = CharClass((), negated=True)


@dataclass(slots=True)
class Grammar:
    """Rules in definition order; ``lookaheads`` keeps xgrammar's ``(= ...)`` hints per rule."""

    rules: dict[str, Node] = field(default_factory=dict)
    lookaheads: dict[str, Node] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# EBNF reader (xgrammar 0.2.9's lexer and parser rules, plus the GBNF forms named above)
# ----------------------------------------------------------------------------------------------

_ESCAPES = {"'": 39, '"': 34, "?": 63, "\\": 92, "/": 47, "0": 0}
_ESCAPES.update({"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "e": 27})
_CLASS_ESCAPES = {c: ord(c) for c in "^$\\.*+?()[]{}|/-"}
_CLASS_SHORTHANDS = "dDsSwW"
_PUNCT = {c: c for c in "(){}|,*+?="}
_SEQUENCE_END = frozenset({"|", ")", "(=", "rule", "eof"})
_MACROS = frozenset({"TagDispatch", "Token", "ExcludeToken", "TokenTagDispatch", "Regex"})
_MAX_NESTING = 150
_ATTRIBUTE = r'(?:max_tokens[ \t]*=[ \t]*\d{1,10}|capture(?:[ \t]*=[ \t]*"[^"\\\r\n]+")?)'
_ATTRIBUTES = re.compile(
    rf"\[[ \t]*({_ATTRIBUTE}(?:[ \t]*,[ \t]*{_ATTRIBUTE})*)[ \t]*\](?=[ \t]*::=)"
)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # punctuation itself, or: "(=", "::=", str, class, ident, rule, int, eof
    value: Any
    line: int
    col: int


def _is_name_char(c: str, *, first: bool) -> bool:
    if not c.isascii():
        return False
    return c in "_-." or c.isalpha() or (not first and c.isdigit())


class _Lexer:
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

    def tokens(self) -> list[_Tok]:
        out: list[_Tok] = []
        while True:
            self.skip_space()
            line, col, c = self.line, self.col, self.peek()
            if not c:
                out.append(_Tok("eof", None, line, col))
                return _mark_rule_names(out)
            kind, value = self.next_token(c)
            out.append(_Tok(kind, value, line, col))

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


def _checked_codepoint(cp: int, lexer: _Lexer) -> int:
    if cp > MAX_CODEPOINT:
        raise lexer.error(f"code point {cp:#x} is beyond U+10FFFF")
    if 0xD800 <= cp <= 0xDFFF:
        raise lexer.error(f"surrogate code point {cp:#x} is not a character")
    return cp


def _class_ranges(items: list[int | None], lexer: _Lexer) -> tuple[tuple[int, int], ...]:
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


def _mark_rule_names(tokens: list[_Tok]) -> list[_Tok]:
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
        out[i - 1] = _Tok("rule", name.value, name.line, name.col)
    return out


class _Parser:
    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens, self.i, self.depth = tokens, 0, 0
        self.grammar = Grammar()
        self.attributes: dict[str, str] = {}
        self.rule_names = [t.value[0] for t in tokens if t.kind == "rule"]

    def error(self, message: str, tok: _Tok | None = None) -> ValueError:
        tok = tok or self.peek()
        return ValueError(f"EBNF syntax error at line {tok.line}, column {tok.col}: {message}")

    def peek(self) -> _Tok:
        return self.tokens[self.i]

    def take(self, kind: str, what: str) -> _Tok:
        tok = self.peek()
        if tok.kind != kind:
            raise self.error(f"expected {what}, got {_describe(tok)}")
        self.i += 1
        return tok

    def parse(self) -> Grammar:
        seen: set[str] = set()
        for tok in self.tokens:
            if tok.kind == "rule" and tok.value[0] in seen:
                raise self.error(f"rule {tok.value[0]!r} is defined more than once", tok)
            if tok.kind == "rule":
                seen.add(tok.value[0])
        if "root" not in seen:
            raise ValueError("EBNF grammar has no root rule (expected a rule named 'root')")
        while self.peek().kind != "eof":
            self.rule()
        return self.grammar

    def rule(self) -> None:
        name, attributes = self.take("rule", "a rule name at the start of a line").value
        self.take("::=", "'::='")
        self.grammar.rules[name] = self.choices()
        if attributes:
            self.attributes[name] = attributes
        if self.peek().kind == "(=":
            self.i += 1
            self.grammar.lookaheads[name] = self.choices()
            self.take(")", "')' closing the lookahead assertion")

    def choices(self) -> Node:
        options = [self.sequence()]
        while self.peek().kind == "|":
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek().kind not in _SEQUENCE_END:  # GBNF: an empty sequence is allowed
            items.append(self.quantified())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self) -> Node:
        item = self.element()
        kind = self.peek().kind
        if kind in ("*", "+", "?"):
            self.i += 1
            return Repeat(item, 1 if kind == "+" else 0, 1 if kind == "?" else None)
        if kind == "{":
            return self.repetition(item)
        return item

    def repetition(self, item: Node) -> Node:
        brace = self.take("{", "'{'")
        lo = 0 if self.peek().kind == "," else self.take("int", "a repetition count").value
        if self.peek().kind == "}":
            self.i += 1
            return Repeat(item, lo, lo)
        self.take(",", "',' or '}' in the repetition range")
        hi: int | None
        if self.peek().kind == "}":
            hi = None
        elif self.peek().kind == "ident" and self.peek().value[0] == "-1":
            self.i, hi = self.i + 1, None
        else:
            hi = self.take("int", "a repetition bound").value
        self.take("}", "'}' closing the repetition range")
        if hi is not None and hi < lo:
            raise self.error(f"repetition range {{{lo},{hi}}} has lower bound above upper", brace)
        return Repeat(item, lo, hi)

    def element(self) -> Node:
        tok = self.peek()
        self.i += 1
        if tok.kind == "str":
            return Lit(tok.value)
        if tok.kind == "class":
            return tok.value  # type: ignore[no-any-return]
        if tok.kind == "(":
            return self.group(tok)
        if tok.kind == "ident":
            return self.reference(tok)
        raise self.error(f"expected an element, got {_describe(tok)}", tok)

    def group(self, tok: _Tok) -> Node:
        if self.peek().kind == ")":
            self.i += 1
            return Lit("")
        self.depth += 1
        if self.depth > _MAX_NESTING:
            raise self.error(f"parentheses nested more than {_MAX_NESTING} deep", tok)
        inner = self.choices()
        self.take(")", "')'")
        self.depth -= 1
        return inner

    def reference(self, tok: _Tok) -> Node:
        name = tok.value[0]
        if name in _MACROS:
            raise self.error(f"xgrammar macro {name}(...) has no equivalent here", tok)
        if name in self.rule_names:
            return Ref(name)
        if set(name) == {"."}:  # GBNF: '.' is any character
            return ANY_CHAR if len(name) == 1 else Seq((ANY_CHAR,) * len(name))
        raise self.error(f"rule {name!r} is not defined", tok)


def _describe(tok: _Tok) -> str:
    if tok.kind == "eof":
        return "end of input"
    if tok.kind in ("ident", "rule"):
        return f"name {tok.value[0]!r}"
    if tok.kind in ("str", "int"):
        return f"{tok.kind} {tok.value!r}"
    return "a character class" if tok.kind == "class" else repr(tok.kind)


def parse_ebnf(text: str) -> tuple[Grammar, dict[str, str]]:
    """Parse EBNF into rules; also returns the raw rule attribute blocks (``name[...] ::=``)."""
    if not isinstance(text, str):
        raise ValueError(f"EBNF grammar must be a string, got {type(text).__name__}")
    parser = _Parser(_Lexer(text).tokens())
    return parser.parse(), parser.attributes


# ----------------------------------------------------------------------------------------------
# Writers: xgrammar EBNF and llguidance Lark
# ----------------------------------------------------------------------------------------------

_XGR_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_XGR_CLASS_ESCAPES = {c: "\\" + c for c in "]\\-^["} | {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _xgr_char(c: str, escapes: Mapping[str, str]) -> str:
    if c in escapes:
        return escapes[c]
    # \u has a fixed width; xgrammar's \x reads every hex digit that follows
    return f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c


def xgrammar_literal(text: str) -> str:
    """``text`` as an xgrammar EBNF string literal."""
    return '"' + "".join(_xgr_char(c, _XGR_ESCAPES) for c in text) + '"'


def _repeat_suffix(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _is_empty(node: Node) -> bool:
    return (isinstance(node, Lit) and not node.text) or (isinstance(node, Seq) and not node.items)


def _write(node: Node, atom: Any, *, top: bool = False) -> str:
    """Shared precedence logic: ``atom`` writes literals, classes and references."""
    if isinstance(node, Alt):
        text = " | ".join(_write(item, atom, top=isinstance(item, Seq)) for item in node.items)
        return text if top else f"({text})"
    if isinstance(node, Seq):
        if not node.items:
            return '""'
        text = " ".join(_write(item, atom) for item in node.items)
        return text if top else f"({text})"
    if isinstance(node, Repeat):
        if node.hi == 0 or _is_empty(node.item):
            return '""'
        inner = _write(node.item, atom)
        if isinstance(node.item, Repeat) or (
            isinstance(node.item, Lit) and len(node.item.text) > 1
        ):
            inner = f"({inner})"
        return inner + _repeat_suffix(node.lo, node.hi)
    return str(atom(node))


def _xgr_atom(node: Node) -> str:
    if isinstance(node, Lit):
        return xgrammar_literal(node.text)
    if isinstance(node, CharClass):
        body = "".join(
            _xgr_char(chr(lo), _XGR_CLASS_ESCAPES)
            + ("" if lo == hi else "-" + _xgr_char(chr(hi), _XGR_CLASS_ESCAPES))
            for lo, hi in node.ranges
        )
        return f"[{'^' if node.negated else ''}{body}]"
    assert isinstance(node, Ref)
    return node.name


def _lark_class(node: CharClass) -> str:
    if not node.ranges:
        return "/(?s:.)/" if node.negated else "/[^\\x{0}-\\x{10FFFF}]/"  # any / no character
    body = "".join(
        f"\\x{{{lo:x}}}" if lo == hi else f"\\x{{{lo:x}}}-\\x{{{hi:x}}}" for lo, hi in node.ranges
    )
    return f"/[{'^' if node.negated else ''}{body}]/"


def lark_literal(text: str) -> str:
    """``text`` as one Lark string literal (one lexeme)."""
    return json.dumps(text)


def _lark_chars(text: str) -> str:
    """``text`` as a sequence of one-character lexemes (see the module docstring)."""
    if not text:
        return '""'
    return " ".join(json.dumps(c) for c in text)


class LarkWriter:
    """Accumulates Lark rules under unique lowercase names; ``start`` is the entry rule."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.taken: set[str] = {"start"}

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^a-z0-9_]", "_", hint.lower()).strip("_") or "r"
        base = base if base[0].isalpha() else "r_" + base
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def rule(self, name: str, body: str) -> str:
        self.lines.append(f"{name}: {body}")
        return name

    def add_grammar(self, grammar: Grammar, *, root: str) -> str:
        """Write every rule of ``grammar``; its ``root`` rule gets the name ``root``."""
        names = {name: root if name == "root" else self.fresh(name) for name in grammar.rules}

        def atom(node: Node) -> str:
            if isinstance(node, Lit):
                return _lark_chars(node.text)
            if isinstance(node, CharClass):
                return _lark_class(node)
            assert isinstance(node, Ref)
            return names[node.name]

        for name, body in grammar.rules.items():
            text = _write(body, atom, top=True)
            self.rule(names[name], text)
        return root

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Public API: EBNF and CHOICE
# ----------------------------------------------------------------------------------------------


def normalize_ebnf(ebnf: str) -> str:
    """Rewrite EBNF so that xgrammar 0.2.9 accepts it, without changing its language.

    The GBNF-only forms (empty alternatives, ``.``, ``{,n}``) become ``""``, ``[^]`` and
    ``{0,n}``; everything else (rule names, attributes, lookahead assertions) is kept.

    Raises:
        ValueError: the grammar is malformed (the message gives line and column).
    """
    grammar, attributes = parse_ebnf(ebnf)
    lines = []
    for name, body in grammar.rules.items():
        head = f"{name}[{attributes[name]}]" if name in attributes else name
        line = f"{head} ::= {_write(body, _xgr_atom, top=True)}"
        if name in grammar.lookaheads:
            line += f" (= {_write(grammar.lookaheads[name], _xgr_atom, top=True)})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def ebnf_to_lark(ebnf: str) -> str:
    """Convert xgrammar/GBNF EBNF (root rule ``root``) to llguidance Lark with the same language.

    The Lark grammar's entry rule is ``start``. Every literal character and character class
    becomes its own one-character lexeme, so llguidance's greedy lexer cannot cut a string
    differently from the character-level grammar. Lookahead assertions ``(= ...)`` are dropped:
    xgrammar 0.2.9 treats them as hints and neither accepts nor masks by them (``a ::= "x" (=
    "z")`` followed by ``"y"`` still accepts ``"xy"``), so the language does not change.

    Raises:
        ValueError: the grammar is malformed, or uses an xgrammar macro (``TagDispatch``,
            ``Token``, ``ExcludeToken``, ``TokenTagDispatch``, ``Regex``) or the rule attribute
            ``max_tokens``, which have no equivalent with the same meaning.
    """
    grammar, attributes = parse_ebnf(ebnf)
    for name, attribute in attributes.items():
        if "max_tokens" in attribute:
            raise ValueError(f"rule attribute max_tokens (rule {name!r}) cannot be converted")
    writer = LarkWriter()
    writer.add_grammar(grammar, root="start")
    return writer.text()


def _checked_choices(choices: Sequence[str]) -> list[str]:
    if isinstance(choices, str):
        raise ValueError("choice list must be a sequence of strings, not a single string")
    items = list(choices)
    if not items:
        raise ValueError("choice list is empty: a CHOICE guide needs at least one string")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ValueError(f"choice {i} is a {type(item).__name__}, not a string")
        if any(0xD800 <= ord(c) <= 0xDFFF for c in item):
            raise ValueError(f"choice {i} contains a lone surrogate, which is not a character")
    return items


def choice_to_ebnf(choices: Sequence[str]) -> str:
    """xgrammar EBNF (root rule ``root``) matching exactly one of ``choices``.

    Any string content works (quotes, backslashes, control characters, non-ASCII, ``""``);
    duplicates are allowed.

    Raises:
        ValueError: the list is empty or holds something other than strings.
    """
    items = _checked_choices(choices)
    return "root ::= " + " | ".join(xgrammar_literal(item) for item in items) + "\n"


def choice_to_lark(choices: Sequence[str]) -> str:
    """llguidance Lark (entry rule ``start``) matching exactly one of ``choices``.

    Each choice is one lexeme; nothing follows it, so greedy lexing cannot split a choice.

    Raises:
        ValueError: the list is empty or holds something other than strings.
    """
    items = _checked_choices(choices)
    return "start: " + " | ".join(lark_literal(item) for item in dict.fromkeys(items)) + "\n"


# ----------------------------------------------------------------------------------------------
# Structural tags (xgrammar 0.2.9's formats) -> Lark
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tail:
    """What follows a format: the end of the grammar (``eof``), something the caller writes
    (``opaque``), or one of ``ends``, which the format itself must write after its content."""

    kind: str
    ends: tuple[str, ...] = ()


_EOF = _Tail("eof")
_OPAQUE = _Tail("opaque")


def _rx(text: str) -> str:
    """``text`` as a literal inside a Rust regex."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text)


def _avoiding(strings: Sequence[str], *, nonempty: bool = False) -> str:
    """A Lark terminal expression: text (any characters) containing none of ``strings``."""
    text = "/(?s:.+)/" if nonempty else "/(?s:.*)/"
    if not strings:
        return text
    return f"{text} & ~/(?s:.*)(?:{'|'.join(_rx(s) for s in strings)})(?s:.*)/"


def _check_separable(strings: Sequence[str], what: str) -> None:
    """Free text is cut at the first delimiter; that equals xgrammar's reading only when no
    delimiter occurs inside another or overlaps one (a proper prefix equal to a suffix)."""
    for a in strings:
        if not a:
            raise ValueError(f"{what}: an empty string cannot delimit free text")
        for b in strings:
            if a != b and a in b:
                raise ValueError(f"{what}: {a!r} occurs inside {b!r}, cannot convert exactly")
            if any(len(b) > k and b.endswith(a[:k]) for k in range(1, len(a))):
                raise ValueError(f"{what}: {b!r} overlaps {a!r}, cannot convert exactly")


def _field(
    fmt: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    value = fmt.get(key, default)
    if value is ...:
        raise ValueError(f"structural tag format {fmt.get('type')!r} is missing {key!r}")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValueError(f"structural tag format {fmt.get('type')!r}: {key!r} has the wrong type")
    return value


class _StructWriter:
    """Writes one format as a Lark expression that also consumes what its :class:`_Tail` asks."""

    def __init__(self) -> None:
        self.out = LarkWriter()

    def emit(self, fmt: Any, tail: _Tail) -> str:
        if not isinstance(fmt, Mapping):
            raise ValueError(f"structural tag format must be an object, got {fmt!r:.60}")
        handler = getattr(self, f"_fmt_{fmt.get('type')}", None)
        if handler is None or not isinstance(fmt.get("type"), str):
            raise ValueError(f"unknown structural tag format type {fmt.get('type')!r}")
        return str(handler(fmt, tail))

    def then(self, body: str, tail: _Tail) -> str:
        return f"{body} {self.one_of(tail.ends)}" if tail.kind == "ends" else body

    @staticmethod
    def one_of(strings: Sequence[str]) -> str:
        return "(" + " | ".join(_lark_chars(s) for s in strings) + ")"

    def terminal_rule(self, hint: str, terminal: str, *, lazy: bool = False) -> str:
        """A rule whose body is one lexeme (``lazy``: the shortest match ends it)."""
        name = self.out.fresh(hint)
        self.out.lines.append(f"{name.upper()}: {terminal}")
        self.out.lines.append(f"{name}{'[lazy]' if lazy else ''}: {name.upper()}")
        return name

    def free_text(self, what: str, stops: Sequence[str], tail: _Tail, max_chars: Any = None) -> str:
        """Free text avoiding ``stops``; it ends the grammar or runs up to one of ``tail.ends``."""
        limit = f" & /(?s:.){{0,{max_chars}}}/" if max_chars is not None else ""
        if tail.kind == "eof":
            if max_chars == 0:
                return '""'
            return self.terminal_rule("text", _avoiding(stops, nonempty=True) + limit) + "?"
        if tail.kind == "ends":
            _check_separable([*stops, *tail.ends], what)
            ends = "|".join(_rx(s) for s in tail.ends)
            body = f"({_avoiding(stops)}{limit}) /(?:{ends})/"
            return self.terminal_rule("text", body, lazy=True)
        raise ValueError(f"{what} must end the structural tag or the content of a tag")

    # -- basic formats ---------------------------------------------------------------------

    def _fmt_const_string(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        return self.then(_lark_chars(_field(fmt, "value", str)), tail)

    def _fmt_json_schema(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        schema = _field(fmt, "json_schema", (bool, dict))
        if _field(fmt, "style", str, "json") != "json":
            raise ValueError(f"json_schema style {fmt['style']!r} has no llguidance equivalent")
        for key, default in (("any_order", False), ("max_whitespace_cnt", None), ("excludes", [])):
            if fmt.get(key, default) != default:
                raise ValueError(f"json_schema option {key!r} has no llguidance equivalent")
        if schema is False:
            raise ValueError("json_schema false matches nothing")
        body = json.dumps(_strict_schema({} if schema is True else schema))
        return self.then(self.out.rule(self.out.fresh("json"), f"%json {body}"), tail)

    def _fmt_qwen_xml_parameter(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        raise ValueError("format type 'qwen_xml_parameter' has no llguidance equivalent")

    def _fmt_grammar(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        text = _field(fmt, "grammar", str)
        syntax = _field(fmt, "syntax", str, "ebnf")
        if syntax == "lark":  # xgrammar reads Lark character by character, not greedily
            text = _xgrammar_ebnf("from_lark", text)
        elif syntax != "ebnf":
            raise ValueError(f"grammar syntax {syntax!r} is not 'ebnf' or 'lark'")
        return self.then(self.sub_grammar(text), tail)

    def _fmt_regex(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        text = _xgrammar_ebnf("from_regex", _field(fmt, "pattern", str))
        return self.then(self.sub_grammar(text), tail)

    def sub_grammar(self, ebnf: str) -> str:
        grammar, attributes = parse_ebnf(ebnf)
        if attributes:
            raise ValueError("rule attributes inside a structural tag grammar cannot be converted")
        return self.out.add_grammar(grammar, root=self.out.fresh("grammar"))

    def _fmt_any_text(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        if fmt.get("max_tokens") is not None:
            raise ValueError("any_text max_tokens (a token budget) cannot be converted")
        excludes = _strings(fmt, "excludes")
        max_chars = _field(fmt, "max_chars", (int, type(None)), None)
        return self.free_text("any_text", excludes, tail, max_chars)

    # -- combinators -----------------------------------------------------------------------

    def _fmt_sequence(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        elements = _nonempty_list(fmt, "elements")
        parts = [self.emit(e, _OPAQUE) for e in elements[:-1]]
        return " ".join([*parts, self.emit(elements[-1], tail)])

    def _fmt_or(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        return "(" + " | ".join(self.emit(e, tail) for e in _nonempty_list(fmt, "elements")) + ")"

    def _fmt_optional(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        content = _field(fmt, "content", dict)
        if tail.kind == "ends":
            return f"({self.emit(content, tail)} | {self.one_of(tail.ends)})"
        return f"({self.emit(content, tail)})?"

    def _fmt_star(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        return self.then(f"({self.emit(_field(fmt, 'content', dict), _OPAQUE)})*", tail)

    def _fmt_plus(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        return self.then(f"({self.emit(_field(fmt, 'content', dict), _OPAQUE)})+", tail)

    def _fmt_repeat(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        lo, hi = _field(fmt, "min", int), _field(fmt, "max", int)
        if lo < 0 or (hi != -1 and hi < lo):
            raise ValueError(f"repeat range min={lo}, max={hi} is invalid")
        if hi == 0:
            return self.then('""', tail)
        body = self.emit(_field(fmt, "content", dict), _OPAQUE)
        return self.then(f"({body}){_repeat_suffix(lo, None if hi == -1 else hi)}", tail)

    def _fmt_tag(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        return self.then(self.tag(fmt, skip=0), tail)

    def tag(self, fmt: Any, *, skip: int) -> str:
        """A tag (begin, content, end), without the first ``skip`` characters of its begin."""
        if not isinstance(fmt, Mapping) or fmt.get("type", "tag") != "tag":
            raise ValueError("structural tag 'tags' must hold formats of type 'tag'")
        begin, end = fmt.get("begin"), fmt.get("end")
        head = _lark_chars(begin[skip:]) if isinstance(begin, str) else self.token(begin)
        content = _field(fmt, "content", dict)
        if isinstance(end, str) or (isinstance(end, list) and end):
            ends = (end,) if isinstance(end, str) else tuple(_strings(fmt, "end"))
            return f"{head} {self.emit(content, _Tail('ends', ends))}"
        return f"{head} {self.emit(content, _OPAQUE)} {self.token(end)}"

    def _fmt_tags_with_separator(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        one = "(" + " | ".join(self.tag(t, skip=0) for t in _nonempty_list(fmt, "tags")) + ")"
        sep = _lark_chars(_field(fmt, "separator", str))
        stop_after_first = _field(fmt, "stop_after_first", bool, False)
        body = one if stop_after_first else f"{one} ({sep} {one})*"
        if not _field(fmt, "at_least_one", bool, False):
            body = f"({body})?"
        return self.then(body, tail)

    # -- free text with dispatch -----------------------------------------------------------

    def _fmt_triggered_tags(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        triggers = _strings(fmt, "triggers")
        if not triggers:
            raise ValueError("triggered_tags needs at least one trigger")
        tags = _nonempty_list(fmt, "tags")
        by_trigger: dict[str, list[Any]] = {t: [] for t in triggers}
        for tag in tags:
            begin = tag.get("begin") if isinstance(tag, Mapping) else None
            if not isinstance(begin, str):
                raise ValueError(
                    "triggered_tags tags need string begins (use token_triggered_tags)"
                )
            matching = [t for t in triggers if begin.startswith(t)]
            if len(matching) != 1:
                raise ValueError(f"tag begin {begin!r} must start with exactly one trigger")
            by_trigger[matching[0]].append(tag)

        def group(trigger: str, after: _Tail) -> str:
            body = " | ".join(self.tag(t, skip=len(trigger)) for t in by_trigger[trigger])
            return self.then(f"({body})", after)

        rules = [(t, group) for t in triggers if by_trigger[t]]
        excludes = _strings(fmt, "excludes")
        at_least_one = _field(fmt, "at_least_one", bool, False)
        stop_after_first = _field(fmt, "stop_after_first", bool, False)
        first = "(" + " | ".join(self.tag(t, skip=0) for t in tags) + ")"
        if at_least_one and stop_after_first:
            return self.then(first, tail)
        dispatch = self.dispatch("triggered_tags", rules, excludes, tail, loop=not stop_after_first)
        return f"{first} {dispatch}" if at_least_one else dispatch

    def _fmt_dispatch(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        formats: dict[str, Any] = {}
        for rule in _nonempty_list(fmt, "rules"):
            if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)):
                raise ValueError("dispatch rules must be [pattern, format] pairs")
            formats[rule[0]] = rule[1]
        rules = [(p, lambda p, after: self.emit(formats[p], after)) for p in formats]
        loop = _field(fmt, "loop", bool, True)
        return self.dispatch("dispatch", rules, _strings(fmt, "excludes"), tail, loop=loop)

    def dispatch(
        self,
        what: str,
        rules: list[tuple[str, Any]],
        excludes: list[str],
        tail: _Tail,
        *,
        loop: bool,
    ) -> str:
        """xgrammar's TagDispatch: free text; each trigger (which free text never contains)
        starts its rule; with ``loop`` free text resumes after it, else the format ends."""
        triggers = [t for t, _ in rules]
        stops = [*triggers, *excludes, *(tail.ends if tail.kind == "ends" else ())]
        _check_separable(stops, f"{what} triggers and excludes")
        lead_ins = [
            self.terminal_rule("trigger", f"({_avoiding(stops)}) /{_rx(t)}/", lazy=True)
            for t in triggers
        ]
        final = self.free_text(what, [*triggers, *excludes], tail)
        after = _OPAQUE if loop else tail
        branches = [f"{lead} {body(t, after)}" for lead, (t, body) in zip(lead_ins, rules, strict=True)]
        if loop:
            return f"({' | '.join(branches)})* {final}"
        return "(" + " | ".join([*branches, final]) + ")"

    # -- tokens ----------------------------------------------------------------------------

    def token(self, fmt: Any) -> str:
        if not isinstance(fmt, Mapping) or fmt.get("type", "token") != "token":
            raise ValueError(f"expected a string or a token format, got {fmt!r:.60}")
        return _token_ref(fmt.get("token"))

    def _fmt_token(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        return self.then(self.token(fmt), tail)

    def _fmt_exclude_token(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        return self.then(_token_set(fmt, "exclude_tokens", negated=True), tail)

    def _fmt_any_tokens(self, fmt: Mapping[str, Any], tail: _Tail) -> str:
        if fmt.get("max_tokens") is not None:
            raise ValueError("any_tokens max_tokens (a token budget) cannot be converted")
        return self.then(_token_set(fmt, "exclude_tokens", negated=True) + "*", tail)


def _token_ref(token: Any) -> str:
    if isinstance(token, int) and not isinstance(token, bool) and token >= 0:
        return f"<[{token}]>"
    if isinstance(token, str) and re.fullmatch(r"<[^<>\s]+>", token):
        return token  # llguidance resolves a special token by its text
    raise ValueError(f"token {token!r} is neither a token id nor a special token like <|x|>")


def _token_set(fmt: Mapping[str, Any], key: str, *, negated: bool) -> str:
    ids = fmt.get(key, [])
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise ValueError(f"{fmt.get('type')} {key!r} must be a list of token ids")
    if not ids:
        return "<[*]>" if negated else "<[^*]>"
    return f"<[{'^' if negated else ''}{','.join(str(i) for i in sorted(set(ids)))}]>"


def _strings(fmt: Mapping[str, Any], key: str) -> list[str]:
    value = fmt.get(key, [])
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ValueError(f"structural tag format {fmt.get('type')!r}: {key!r} must be strings")
    return value


def _nonempty_list(fmt: Mapping[str, Any], key: str) -> list[Any]:
    value = fmt.get(key)
    if not isinstance(value, list) or not value:
        raise ValueError(f"structural tag format {fmt.get('type')!r} needs a non-empty {key!r}")
    return value


def _xgrammar_ebnf(reader: str, text: str) -> str:
    """xgrammar's own reading of a regex or Lark grammar, printed as EBNF."""
    import xgrammar

    try:
        return str(getattr(xgrammar.Grammar, reader)(text))
    except Exception as exc:  # xgrammar raises RuntimeError and friends
        raise ValueError(f"xgrammar cannot read {text!r:.80}: {exc}") from exc


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def _strict_schema(schema: Any) -> Any:
    """xgrammar compiles structural-tag schemas strictly: an object without
    ``additionalProperties`` allows no other property (llguidance's default allows any)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _strict_schema(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_strict_schema(v) for v in out[key]]
    for key in _SCHEMA_ONES:
        if key in out:
            out[key] = _strict_schema(out[key])
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


def _current_format(tag: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """The format of a structural tag in either form (legacy ``structures``/``triggers`` too)."""
    if isinstance(tag, str):
        try:
            tag = json.loads(tag)
        except json.JSONDecodeError as exc:
            raise ValueError(f"structural tag is not valid JSON: {exc}") from exc
    if not isinstance(tag, Mapping):
        raise ValueError("structural tag must be a JSON object")
    if "structures" in tag:
        return _legacy_format(tag)
    if tag.get("type", "structural_tag") != "structural_tag" or "format" not in tag:
        raise ValueError(
            'structural tag must be {"type": "structural_tag", "format": {...}} '
            'or the legacy {"structures": [...], "triggers": [...]}'
        )
    return tag["format"]  # type: ignore[no-any-return]


def _legacy_format(tag: Mapping[str, Any]) -> dict[str, Any]:
    """xgrammar's StructuralTag.from_legacy_structural_tag, as plain JSON."""
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise ValueError("legacy structural tag needs 'structures' and 'triggers' lists")
    tags = []
    for item in structures:
        if not isinstance(item, Mapping) or not {"begin", "schema", "end"} <= item.keys():
            raise ValueError("each legacy structure needs 'begin', 'schema' and 'end'")
        schema = item["schema"]
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"legacy structure schema is not valid JSON: {exc}") from exc
        content = {"type": "json_schema", "json_schema": schema}
        tags.append({"type": "tag", "begin": item["begin"], "content": content, "end": item["end"]})
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags}


def structural_tag_to_xgrammar_arg(tag: Mapping[str, Any] | str) -> str:
    """The structural tag as the JSON text ``GrammarCompiler.compile_structural_tag`` takes,
    with the legacy form rewritten as xgrammar itself would (one triggered_tags format)."""
    return json.dumps({"type": "structural_tag", "format": _current_format(tag)})


def structural_tag_to_lark(tag: Mapping[str, Any] | str) -> str:
    """Convert an xgrammar 0.2.9 structural tag to llguidance Lark with the same language.

    Accepts ``{"type": "structural_tag", "format": {...}}`` (as a dict or JSON text) and the
    legacy ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``.

    Supported format types: const_string, json_schema (style ``json``, via ``%json`` with
    xgrammar's strict ``additionalProperties``), grammar (EBNF; Lark is first read by xgrammar,
    which reads it character by character), regex (read by xgrammar), sequence, or, tag,
    any_text, triggered_tags, tags_with_separator, optional, star, plus, repeat, dispatch,
    token, exclude_token and any_tokens.

    Free text (any_text, the text around triggered_tags and dispatch) must end the grammar or
    run up to a tag's end strings; there it becomes one lazy lexeme that stops at the first
    delimiter, which is xgrammar's reading when no delimiter overlaps another.

    Raises:
        ValueError: the tag is malformed, or uses what cannot keep its meaning: format types
            qwen_xml_parameter, token_triggered_tags and token_dispatch; json_schema styles
            other than ``json``, ``any_order``, ``max_whitespace_cnt`` and ``excludes``;
            ``max_tokens`` budgets; free text elsewhere; overlapping delimiters.
    """
    writer = _StructWriter()
    body = writer.emit(_current_format(tag), _EOF)
    writer.out.lines.insert(0, f"start: {body}")
    return writer.out.text()
