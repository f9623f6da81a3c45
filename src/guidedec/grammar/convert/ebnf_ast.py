"""The EBNF syntax tree: literals, character classes, references, sequences, alternatives and
bounded or unbounded repetitions, and a grammar as named rules of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

MAX_CODEPOINT = 0x10FFFF


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
