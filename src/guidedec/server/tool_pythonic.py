"""The ``pythonic`` tool-call format: ``[get_weather(city="Paris", days=3), now()]``, a Python
list of calls with keyword arguments (Llama 3.2 and Llama 4 write it).

The guide is a grammar made from each tool's schema: the tool's name, then its properties as
keyword arguments (required ones first, each optional one may be left out, in the schema's
order), each value a Python literal of its type (``str``, ``int``, ``float``, ``True``/``False``,
``None``, lists of the item type, an ``enum``'s or ``const``'s values). Other keywords (bounds,
patterns, nested object properties) are not held: a value of the right type is. A call opens
with ``[name(`` (the trigger in ``auto``). Arguments are read back with :mod:`ast` into JSON.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from guidedec.server.tool_parsers import Piece, Schemas, ToolParser, calls_guide, tag

_COMMON = r"""
py_any ::= py_str | py_num | "True" | "False" | "None" | py_list | py_dict
py_str ::= "\"" ([^"\\\n\r] | "\\" [^\n\r])* "\""
py_int ::= "-"? [0-9]+
py_num ::= "-"? [0-9]+ ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
py_list ::= "[" (py_any (", " py_any)*)? "]"
py_dict ::= "{" (py_str ": " py_any (", " py_str ": " py_any)*)? "}"
py_kwargs ::= ([a-zA-Z_] [a-zA-Z0-9_]* "=" py_any (", " [a-zA-Z_] [a-zA-Z0-9_]* "=" py_any)*)?
"""
_TYPES = {
    "string": "py_str",
    "integer": "py_int",
    "number": "py_num",
    "boolean": '("True" | "False")',
    "null": '"None"',
    "object": "py_dict",
}


def _literal(value: Any) -> str:
    """A JSON value as Python source, as an EBNF string."""
    if isinstance(value, bool) or value is None:
        source = {True: "True", False: "False", None: "None"}[value]
    elif isinstance(value, (int, float, str)):
        source = json.dumps(value)
    else:
        source = repr(value)
    return json.dumps(source)


def value_rule(schema: Any) -> str:
    """An EBNF expression of the Python literals a schema's values are written as."""
    if not isinstance(schema, Mapping):
        return "py_any"
    if "const" in schema:
        return _literal(schema["const"])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "(" + " | ".join(_literal(v) for v in schema["enum"]) + ")"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return "(" + " | ".join(value_rule(s) for s in schema[key]) + ")"
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        return "(" + " | ".join(value_rule({**schema, "type": k}) for k in kind) + ")"
    if kind == "array":
        item = value_rule(schema.get("items"))
        return f'("[" ({item} (", " {item})*)? "]")'
    return _TYPES.get(kind, "py_any") if isinstance(kind, str) else "py_any"


def kwargs_rules(prefix: str, schema: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The rule of a tool's keyword arguments, and the rules it needs."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return "py_kwargs", []
    required = set(schema.get("required", []))
    order = [p for p in properties if p in required] + [p for p in properties if p not in required]
    rules = [f'{prefix}_{len(order)}_{s} ::= ""' for s in (0, 1)]
    for i in reversed(range(len(order))):
        name, value = order[i], value_rule(properties[order[i]])
        for started in (0, 1):
            separator = '", " ' if started else ""
            take = f'{separator}"{name}=" {value} {prefix}_{i + 1}_1'
            skip = "" if name in required else f" | {prefix}_{i + 1}_{started}"
            rules.append(f"{prefix}_{i}_{started} ::= {take}{skip}")
    return f"{prefix}_0_0", rules


class PythonicParser(ToolParser):
    name = "pythonic"

    @property
    def triggers(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f"[{name}(" for name in self.tool_names)

    def guide(self, tools: Schemas, choice: str, *, parallel: bool) -> dict[str, Any]:
        """A tag per tool, ``[name(`` to ``]``: its arguments, then (``parallel``) more calls;
        a named tool's tag ends after its one call."""
        rules, calls = [], []
        for i, (name, schema) in enumerate(tools.items()):
            kwargs, more = kwargs_rules(f"t{i}", schema)
            rules += [f"args_{i} ::= {kwargs}", *more]
            calls.append(f'"{name}(" args_{i} ")"')
        rules.append("call ::= " + " | ".join(calls))
        rest = ' (", " call)*' if parallel else ""

        def opened(i: int, name: str, root: str, end: str) -> dict[str, Any]:
            grammar = "\n".join([f"root ::= {root}", *rules]) + _COMMON
            return tag(f"[{name}(", {"type": "grammar", "grammar": grammar}, end)

        if choice in tools:
            i = list(tools).index(choice)
            return opened(i, choice, f"args_{i}", ")]")
        tags = [opened(i, name, f'args_{i} ")"{rest}', "]") for i, name in enumerate(tools)]
        if choice == "required":
            return {"type": "or", "elements": tags}
        return calls_guide(tags, "", self.triggers, "auto", False)

    def scan(self, text: str) -> list[Piece]:
        starts = [m.start() for m in re.finditer(r"\[([A-Za-z_][\w.-]*)\(", text)]
        starts = [s for s in starts if _name_at(text, s) in self.tool_names]
        if not starts:
            return [Piece(text)] if text else []
        start = starts[0]
        pieces = [Piece(text[:start])] if start else []
        for end in (i + 1 for i in range(start, len(text)) if text[i] == "]"):
            calls = _calls(text[start:end])
            if calls is not None:
                whole = text[start:end]
                for i, (name, arguments) in enumerate(calls):
                    pieces.append(Piece(whole if i == 0 else "", True, name, arguments, True))
                return pieces + self.scan(text[end:])
        return [*pieces, Piece(text[start:], call=True, name=_name_at(text, start))]


def _name_at(text: str, start: int) -> str:
    return text[start + 1 : text.index("(", start)]


def _calls(source: str) -> list[tuple[str, str]] | None:
    """The calls of a Python list of calls with literal keyword arguments, or None."""
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    out = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except ValueError:
            return None
        out.append((ast.unparse(node.func), json.dumps(arguments, ensure_ascii=False)))
    return out
