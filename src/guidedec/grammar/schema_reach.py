"""How far an output of a guide can be from its end: a guide's *reach*.

The reach is an upper bound, in UTF-8 bytes of compact output, on the shortest completion from
any point of an output the guide accepts. A byte-level tokenizer spells any text in at most as
many tokens as it has bytes, so from anywhere in such an output a completion of at most
``reach`` tokens exists. Budget-aware closing checks every sampled token once the budget left
is down to the guide's window, and sizes that window from the reach: a token sampled before it
can commit the output (a property name, an enum string, a ``[``) to a long value only when the
window is shorter than the longest value the guide can commit to.

What is counted, from a JSON schema (no backend involved):

- an object: its braces, every ``required`` property's name and shortest value, the extra
  properties ``minProperties`` asks for, and the farthest point inside one property (its name
  and the reach of its value, or of what ``dependentRequired``/``dependentSchemas`` add);
- an array: its brackets, the shortest items ``minItems`` and ``contains`` ask for, and the
  farthest point inside one item;
- a string: ``minLength``, the reach of its ``pattern`` (:func:`regex_reach`), ``FORMAT_REACH``
  for a ``format``, and an escape sequence; a number: the digits of its bounds; an ``enum`` or
  ``const``: its longest value (from inside a name or a value it spells, the rest measured
  as :func:`guidedec.grammar.ebnf_reach.literal_reach` does);
- ``anyOf``/``oneOf``: the farthest branch (the output may commit to any), added to the node's
  own keywords; ``allOf``, ``$ref`` and ``if``/``then``/``else``: the sum of their parts.

Sums over-count (a required property counted in the object and inside itself), which only makes
the window longer. What is not counted: nesting that the model opens itself, a free-form value
(``ANY_REACH``) or a recursive ``$ref`` taken again: each level it opens owes its own closer,
and one level is counted. A schema too large to read within ``MAX_VISITS`` gets None (unknown).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from guidedec.grammar.auto_policy import NUMBER_KEYWORDS, VALIDATION_KEYWORDS
from guidedec.grammar.ebnf_reach import RecursionMemo, ebnf_reach, literal_reach
from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.grammar.schema_walk import resolve_ref

try:  # the standard library's regex parser (private; a pattern it cannot read gets a guess)
    from re import _parser as _regex_parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - only where the private module moved
    _regex_parser = None

ANY_REACH = 4
"""The reach counted for a value of any type: a string's ``"`` or a number's digit, a closer."""
ESCAPE = 5
"""The most a string owes after a ``\\`` it wrote (``u`` and four hex digits)."""
FORMAT_REACH = 40
"""The reach counted for a ``format`` (a date-time, a UUID: 36 characters, and the quotes)."""
MAX_REACH = 4096
"""Reaches past this are cut to it: past it a schema has no finite instance as far as its
reach can tell (a required recursion), or one longer than budgets run, and closing keeps its
default window."""
MAX_VISITS = 20_000
"""Schema nodes read before the reach is given up as unknown."""
INFINITE = 1 << 30
"""The shortest instance of a schema that has none (``false``, a required recursion)."""
_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
_OWN_KEYWORDS = VALIDATION_KEYWORDS - {
    "$ref",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "enum",
    "const",
}
"""Keywords that constrain a node itself, beside the schemas it composes."""


class _TooLargeError(Exception):
    pass


def utf8_length(text: str) -> int:
    return len(text.encode())


def schema_reach(schema: Any, measure: Callable[[str], int] = utf8_length) -> int | None:
    """The reach of a JSON schema (a parsed one), at most ``MAX_REACH``; None when unknown.
    ``measure`` counts the literal text the schema spells (a property name with its quotes and
    colon, an enum value): its UTF-8 bytes, or the tokens of its encoding, which spell it too
    (both backends accept any tokenization of a text), in as few or fewer."""
    try:
        return min(_Reach(schema, measure).most(schema), MAX_REACH)
    except (_TooLargeError, RecursionError):
        return None


def guide_reach(
    params: GuidedDecodingParams, measure: Callable[[str], int] = utf8_length
) -> int | None:
    """The reach of a guide: a JSON schema's or object's (:func:`schema_reach`), a regex's
    (:func:`regex_reach`), a choice's longest option, an EBNF grammar's
    (:func:`guidedec.grammar.ebnf_reach.ebnf_reach`); None for a Lark grammar or a structural
    tag, whose structure is not read."""
    kind, guide = params.guide_type, params.guide
    if kind is GuideType.JSON_OBJECT:
        return schema_reach({"type": "object"}, measure)
    if kind is GuideType.JSON_SCHEMA:
        try:
            schema = json.loads(guide) if isinstance(guide, str) else guide
        except (ValueError, RecursionError):
            return None
        return schema_reach(schema, measure)
    if kind is GuideType.REGEX:
        return min(regex_reach(str(guide)), MAX_REACH)
    if kind is GuideType.EBNF:
        reach = ebnf_reach(str(guide), measure)
        return None if reach is None else min(reach, MAX_REACH)
    if kind is GuideType.CHOICE and isinstance(guide, list | tuple):
        longest = max((literal_reach(str(option), measure) for option in guide), default=0)
        return min(longest, MAX_REACH)
    return None


def regex_reach(pattern: str) -> int:
    """An upper bound on the shortest completion, in UTF-8 bytes as a JSON string's content, from
    any point of a match of ``pattern``: a literal counts its bytes, any other character 2, a
    repetition its least count (at least 1) times its body, an alternation its longest branch.
    A pattern the parser cannot read counts twice its own length."""
    if _regex_parser is None:
        return 2 * len(pattern.encode())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FutureWarning on sets the re module may change
            parsed = _regex_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, TypeError, ValueError):
        return 2 * len(pattern.encode())
    return min(_sequence(parsed), INFINITE)


def _sequence(items: Iterable[tuple[Any, Any]]) -> int:
    return sum(_regex_item(str(op), arg) for op, arg in items)


def _regex_item(op: str, arg: Any) -> int:
    if op == "LITERAL":
        return len(json.dumps(chr(arg), ensure_ascii=False).encode()) - 2
    if op in ("AT", "ASSERT", "ASSERT_NOT"):
        return 0
    if op == "BRANCH":
        return max((_sequence(branch) for branch in arg[1]), default=0)
    if op == "SUBPATTERN":
        return _sequence(arg[-1])
    if op == "ATOMIC_GROUP":
        return _sequence(arg)
    if op.endswith("_REPEAT"):
        least, _, body = arg
        return max(int(least), 1) * _sequence(body)
    if op == "GROUPREF_EXISTS":
        return max(_sequence(arg[1]), _sequence(arg[2] or []))
    return 2  # a class, any character, a back reference (counted as one character)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class _Reach:
    """``least``: an upper bound on a schema's shortest instance; ``most``: its reach."""

    def __init__(self, root: Any, measure: Callable[[str], int]) -> None:
        self.root = root
        self.measure = measure
        self.memo = RecursionMemo()
        self.visits = 0

    def least(self, node: Any) -> int:
        return self._node(node, least=True)

    def most(self, node: Any) -> int:
        return self._node(node, least=False)

    def _node(self, node: Any, least: bool) -> int:
        if node is False:
            return INFINITE if least else 0
        if not isinstance(node, dict):
            return 1 if least else ANY_REACH

        def compute() -> int:
            self.visits += 1
            if self.visits > MAX_VISITS:
                raise _TooLargeError
            return min(self._schema(node, least), INFINITE)

        # a recursion: its own level is counted where it began
        inside_itself = INFINITE if least else ANY_REACH
        return self.memo.value((id(node), least), compute, inside_itself)

    def _schema(self, node: dict[str, Any], least: bool) -> int:
        if "const" in node:
            return self._literal(_compact(node["const"]), least)
        if isinstance(node.get("enum"), list):
            sizes = [self._literal(_compact(value), least) for value in node["enum"]]
            return (min if least else max)(sizes, default=INFINITE if least else 0)
        composed = any(k in node for k in ("$ref", "allOf", "anyOf", "oneOf", "then", "else"))
        total = self._typed(node, least) if not composed or _OWN_KEYWORDS & node.keys() else 0
        if isinstance(node.get("$ref"), str):
            total += self._node(resolve_ref(node["$ref"], self.root), least)
        total += sum(self._node(part, least) for part in _schemas(node.get("allOf")))
        for keyword in ("anyOf", "oneOf"):
            branches = [self._node(part, least) for part in _schemas(node.get(keyword))]
            if branches:
                total += min(branches) if least else max(branches)
        if "then" in node or "else" in node:
            total += max(self._node(node.get(k, True), least) for k in ("then", "else"))
        return total

    def _typed(self, node: dict[str, Any], least: bool) -> int:
        declared = node.get("type")
        names = [declared] if isinstance(declared, str) else declared
        if not isinstance(names, list) or not names:
            names = list(_TYPES)
        sizes = [self._of_type(str(name), node, least) for name in names]
        return min(sizes) if least else max(sizes)

    def _of_type(self, name: str, node: dict[str, Any], least: bool) -> int:
        if name == "null":
            return 4
        if name == "boolean":
            return 4 if least else 5
        if name in ("integer", "number"):
            return _number(node, least)
        if name == "string":
            return _string(node, least)
        if name == "array":
            return self._array(node, least)
        if name == "object":
            return self._object(node, least)
        return 1 if least else ANY_REACH

    def _array(self, node: dict[str, Any], least: bool) -> int:
        items, prefix = node.get("items", True), node.get("prefixItems")
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, node.get("additionalItems", True)
        prefix = list(_schemas(prefix))
        count = _count(node, "minItems")
        size = 2 + sum(self.least(part) + 1 for part in prefix[:count])
        size += max(0, count - len(prefix)) * (self.least(items) + 1)
        contains = node.get("contains")
        if isinstance(contains, dict):
            size += _count(node, "minContains", 1) * (self.least(contains) + 1)
        if least:
            return size
        inside = [self.most(part) for part in prefix] + [self.most(items)]
        if isinstance(contains, dict):
            inside.append(self.most(contains))
        return size + max(inside) + 1

    def _object(self, node: dict[str, Any], least: bool) -> int:
        properties = node.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        extra = node.get("additionalProperties", True)
        required = [name for name in _names(node.get("required"))]

        def entry(name: str) -> int:  # "name":value, shortest
            return self._name(name) + self.least(properties.get(name, extra)) + 1

        size = 2 + sum(entry(name) for name in required)
        missing = _count(node, "minProperties") - len(required)
        if missing > 0:
            optional = [entry(name) for name in properties if name not in required]
            size += missing * min([*optional, 4 + self.least(extra)])
        if least:
            return size
        inside = [
            literal_reach(_compact(name) + ":", self.measure) + self.most(value) + 1
            for name, value in properties.items()
        ]
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict):
            inside += [regex_reach(p) + 3 + self.most(v) + 1 for p, v in patterns.items()]
        if extra is not False:
            inside.append(3 + ESCAPE + self.most(extra) + 1)
        inside += self._dependent(node, properties, extra)
        return size + max(inside, default=0)

    def _literal(self, text: str, least: bool) -> int:
        """Text the schema spells: all of it (``least``), or its rest from a point inside it."""
        return self.measure(text) if least else literal_reach(text, self.measure)

    def _name(self, name: str) -> int:
        """A property name as written before its value: ``"name":``."""
        return self.measure(_compact(name) + ":")

    def _dependent(self, node: dict[str, Any], properties: dict[str, Any], extra: Any) -> list[int]:
        """What writing one property can add: the names it requires, the schema it brings."""
        added = []
        for keyword in ("dependentRequired", "dependentSchemas", "dependencies"):
            table = node.get(keyword)
            for value in table.values() if isinstance(table, dict) else []:
                if isinstance(value, list):
                    added.append(
                        sum(
                            self._name(n) + self.least(properties.get(n, extra)) + 1
                            for n in _names(value)
                        )
                    )
                elif isinstance(value, dict):
                    added.append(self.most(value))
        return added


def _number(node: dict[str, Any], least: bool) -> int:
    """The digits its bounds need; its reach adds a sign and a fraction or exponent left open."""
    digits = max(
        (_digits(node[k]) for k in NUMBER_KEYWORDS if isinstance(node.get(k), int | float)),
        default=1,
    )
    return digits if least else 3 + digits


def _digits(bound: float) -> int:
    if isinstance(bound, float) and bound.is_integer() and abs(bound) < 1e308:
        return len(str(int(bound)))
    return len(repr(bound))


def _string(node: dict[str, Any], least: bool) -> int:
    content = _count(node, "minLength")
    if isinstance(node.get("pattern"), str):
        content = max(content, regex_reach(node["pattern"]))
    if isinstance(node.get("format"), str):
        content = max(content, FORMAT_REACH)
    return 2 + content + (0 if least else ESCAPE)


def _count(node: dict[str, Any], keyword: str, default: int = 0) -> int:
    """A count keyword's value (``2.0`` is the integer 2 since draft 6); 0 when it is none."""
    value = node.get(keyword, default)
    if isinstance(value, float) and value.is_integer() and value < INFINITE:
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _schemas(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _names(value: Any) -> list[str]:
    return [name for name in value if isinstance(name, str)] if isinstance(value, list) else []
