"""Writers for a parsed EBNF grammar: xgrammar EBNF (:func:`normalize_ebnf`) and llguidance
Lark (:class:`LarkWriter`, :func:`ebnf_to_lark`), with the literal syntax of each."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from guidedec.grammar.convert.ebnf_ast import Alt, CharClass, Grammar, Lit, Node, Ref, Repeat, Seq
from guidedec.grammar.convert.ebnf_parser import parse_ebnf

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


def repeat_suffix(lo: int, hi: int | None) -> str:
    """The EBNF and Lark quantifier for ``lo`` to ``hi`` copies (``hi is None``: unbounded)."""
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
        return inner + repeat_suffix(node.lo, node.hi)
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


def lark_chars(text: str) -> str:
    """``text`` as a sequence of one-character lexemes (see :mod:`guidedec.grammar.convert`)."""
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
                return lark_chars(node.text)
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
