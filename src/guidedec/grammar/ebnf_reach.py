"""The reach of an EBNF grammar: how far an output can be from its end (see
:mod:`guidedec.grammar.schema_reach`, which gives the reach of the other guides).

Read from the grammar's syntax tree (:func:`guidedec.grammar.convert.parse_ebnf`), from its
``root`` rule, with no backend involved:

- ``least``: an upper bound on the shortest text a rule derives, found by relaxation (each
  round reads every rule with the lengths of the round before; the lengths only fall, and
  settle within as many rounds as there are rules);
- ``most``: the farthest point inside a node, as the most that the node can still owe from
  there: in a sequence, the farthest point inside one item plus the least of the items after
  it; in an alternation, its farthest branch; in a repetition, the farthest point inside one
  iteration plus the iterations its lower bound still asks for.

A literal counts its measure (its tokens, or its UTF-8 bytes), and from inside it its longest
suffix's (:func:`literal_reach`); a character class one character (four bytes where it holds no
ASCII one). A rule entered again inside itself (a recursion) counts its least there: one level
of nesting is counted, as for a recursive ``$ref`` in a schema, since each further level the
model opens owes its own closers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from guidedec.grammar.convert.ebnf_ast import Alt, CharClass, Grammar, Lit, Node, Ref, Seq
from guidedec.grammar.convert.ebnf_parser import parse_ebnf

ROOT = "root"
"""The rule an output of an EBNF guide derives (xgrammar's name for it)."""
MAX_WORK = 200_000
"""Syntax-tree nodes read (over all relaxation rounds) before the reach is given up as unknown."""
NO_END = 1 << 30
"""The least of a rule that derives no finite text (or refers to one missing)."""
CHUNK = 64
"""Characters of a literal whose suffixes :func:`literal_reach` encodes one by one."""


class _TooLargeError(Exception):
    pass


class RecursionMemo:
    """Memoised values of a recursive computation that may meet itself (a rule or a schema
    inside itself): a key met again while its value is being computed gets the value given for
    that case, and a value read through such a cycle is not kept, since it holds only where the
    cycle began."""

    def __init__(self) -> None:
        self._values: dict[Hashable, int] = {}
        self._active: set[Hashable] = set()
        self._cycle = False  # the value being computed read a key still being computed

    def value(self, key: Hashable, compute: Callable[[], int], inside_itself: int) -> int:
        if key in self._values:
            return self._values[key]
        if key in self._active:
            self._cycle = True
            return inside_itself
        outer, self._cycle = self._cycle, False
        self._active.add(key)
        try:
            value = compute()
        finally:
            self._active.discard(key)
        if not self._cycle:
            self._values[key] = value
        self._cycle = self._cycle or outer
        return value


def literal_reach(text: str, measure: Callable[[str], int]) -> int:
    """An upper bound on what the rest of a literal ``text`` measures from any point inside it.
    In tokens, a suffix can take more than the whole (``aaaaaaaa`` is one token, the
    ``aaaaaaa`` left after its first ``a`` two), so each suffix is measured, per chunk of
    ``CHUNK`` characters: the chunks spelt one by one spell the text, and from a point inside
    one the rest is a suffix of that chunk and the chunks after it."""
    farthest = after = 0
    for start in reversed(range(0, len(text), CHUNK)):
        chunk = text[start : start + CHUNK]
        rest = max(measure(chunk[i:]) for i in range(len(chunk)))
        farthest = max(farthest, rest + after)
        after += measure(chunk)
    return farthest


def ebnf_reach(ebnf: str, measure: Callable[[str], int]) -> int | None:
    """The reach of an EBNF grammar from its ``root`` rule; ``NO_END`` where the root derives
    no finite text; None when unknown (the grammar does not parse, has no ``root``, or is too
    large to read within ``MAX_WORK``)."""
    try:
        grammar, _ = parse_ebnf(ebnf)
    except (ValueError, RecursionError):
        return None
    if ROOT not in grammar.rules:
        return None
    try:
        reach = _GrammarReach(grammar, measure)
        if reach.least[ROOT] >= NO_END:
            return NO_END
        return min(reach.most_of(ROOT), NO_END)
    except (_TooLargeError, RecursionError):
        return None


class _GrammarReach:
    def __init__(self, grammar: Grammar, measure: Callable[[str], int]) -> None:
        self.rules = grammar.rules
        self.measure = measure
        self.work = 0
        self.least: dict[str, int] = dict.fromkeys(self.rules, NO_END)
        for _ in range(len(self.rules) + 1):
            settled = {name: min(self._least(node), NO_END) for name, node in self.rules.items()}
            if settled == self.least:
                break
            self.least = settled
        self.memo = RecursionMemo()

    def _count(self) -> None:
        self.work += 1
        if self.work > MAX_WORK:
            raise _TooLargeError

    def _least(self, node: Node) -> int:
        self._count()
        if isinstance(node, Lit):
            return self.measure(node.text) if node.text else 0
        if isinstance(node, CharClass):
            return _char(node)
        if isinstance(node, Ref):
            return self.least.get(node.name, NO_END)
        if isinstance(node, Seq):
            return sum(self._least(item) for item in node.items)
        if isinstance(node, Alt):
            return min((self._least(item) for item in node.items), default=NO_END)
        return node.lo * self._least(node.item) if node.lo else 0  # a repetition

    def most_of(self, name: str) -> int:
        """The reach of a rule; inside itself, its least (one level counted)."""
        if name not in self.rules:
            return NO_END
        rule = self.rules[name]
        return self.memo.value(name, lambda: min(self._most(rule), NO_END), self.least[name])

    def _most(self, node: Node) -> int:
        self._count()
        if isinstance(node, Lit):
            return literal_reach(node.text, self.measure)
        if isinstance(node, CharClass):
            return _char(node)
        if isinstance(node, Ref):
            return self.most_of(node.name)
        if isinstance(node, Seq):
            farthest, after = 0, 0
            for item in reversed(node.items):
                farthest = max(farthest, self._most(item) + after)
                after += self._least(item)
            return farthest
        if isinstance(node, Alt):
            return max((self._most(item) for item in node.items), default=0)
        if node.hi == 0:  # a repetition
            return 0
        return self._most(node.item) + max(node.lo - 1, 0) * self._least(node.item)


def _char(node: CharClass) -> int:
    """One character of the class: a byte (a token) where it holds an ASCII one, else four."""
    if not node.negated:
        return 1 if any(lo < 0x80 for lo, _ in node.ranges) else 4
    covered = 0  # the ASCII characters from 0 up that the ranges exclude, in one run
    for lo, hi in sorted(node.ranges):
        if lo > covered:
            break
        covered = max(covered, hi + 1)
    return 1 if covered < 0x80 else 4
