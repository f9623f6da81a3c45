"""Exact rewrites: schema constructs xgrammar ignores, restated in ones it enforces.

xgrammar ignores ``not``, ``if``/``then``/``else``, ``dependentRequired`` and ``uniqueItems``
(see :mod:`guidedec.grammar.auto_policy`). Some uses of them have an equivalent in what it does
enforce (``enum``, ``const``, ``required``, ``prefixItems``, an ``anyOf`` of whole schemas), and
:func:`rewrite_for_xgrammar` replaces those, node by node:

- ``not: {const|enum}`` beside an ``enum`` or ``const``: the values left;
- ``uniqueItems`` over items of a small ``enum`` (or booleans): an ``anyOf`` of every sequence of
  distinct values, each a closed ``prefixItems`` list (at most ``MAX_ALTERNATIVES``);
- ``dependentRequired`` (and ``dependencies`` with name lists, drafts 4 to 7) on a closed
  object: an ``anyOf`` with the trigger absent or all its dependents required;
- ``if: {properties: {k: {const: v}}}`` with ``then``/``else`` that only add ``required``, where
  ``k`` has an ``enum`` (or is boolean): an ``anyOf`` of ``k == v`` plus ``then`` and ``k`` among
  the other values (or absent, on a closed object) plus ``else``;
- with ``list_required`` (the schemas inside structural tags, which always go to xgrammar):
  ``required`` names that ``properties`` does not list (xgrammar then lets them be left out),
  on an object without ``patternProperties`` that admits other properties: each listed, with
  the ``additionalProperties`` schema (or ``{}``). A JSON-schema guide with such names goes to
  llguidance first instead (see :mod:`guidedec.grammar.auto_policy`).

xgrammar drops the keywords beside an ``anyOf``, so each branch is a whole copy of the node. The
result accepts exactly the instances the original accepts; anything else is left as it was.
The engine's final check still validates against the original schema.
"""

from __future__ import annotations

import itertools
import json
import re
from functools import lru_cache
from typing import Any

Schema = dict[str, Any]

MAX_ALTERNATIVES = 64
"""The most branches one rewrite may create."""
_SCHEMA_KEYS = (
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
_LIST_KEYS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_MISSING = object()
_LEGACY_DRAFT = re.compile(r"draft-0[4-7]/")


@lru_cache(maxsize=1024)
def rewrite_for_xgrammar(schema_text: str, list_required: bool = False) -> str:
    """``schema_text`` with the constructs above restated; the text itself when none applies
    (or it is not JSON)."""
    try:
        root = json.loads(schema_text)
    except (ValueError, RecursionError):
        return schema_text
    legacy = (
        isinstance(root, dict) and _LEGACY_DRAFT.search(str(root.get("$schema", ""))) is not None
    )
    try:
        rewritten = _walk(root, legacy, list_required)
    except RecursionError:
        return schema_text
    return schema_text if rewritten == root else json.dumps(rewritten)


def _walk(node: Any, legacy: bool, list_required: bool = False) -> Any:
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = _walk(out[key], legacy, list_required)
    for key in _LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [_walk(child, legacy, list_required) for child in out[key]]
    for key in _MAP_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = {
                name: _walk(child, legacy, list_required) for name, child in out[key].items()
            }
    for rewrite in (_not_beside_values, _unique_enum_items, _if_const):
        out = rewrite(out)
    if list_required:
        out = _required_listed(out)
    return _dependent_required(out, legacy)


def _required_listed(node: Schema) -> Schema:
    names, listed = node.get("required"), node.get("properties", {})
    other = node.get("additionalProperties", True)
    if not isinstance(names, list) or not isinstance(listed, dict) or "patternProperties" in node:
        return node
    missing = [n for n in names if isinstance(n, str) and n not in listed]
    if not missing or other is False or not isinstance(other, dict | bool):
        return node
    value = other if isinstance(other, dict) else {}
    return {**node, "properties": {**listed, **dict.fromkeys(missing, value)}}


def _values(node: Schema) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    values = node.get("enum")
    return list(values) if isinstance(values, list) else None


def _not_beside_values(node: Schema) -> Schema:
    negated = node.get("not")
    values = _values(node)
    if not isinstance(negated, dict) or values is None or set(negated) - {"const", "enum"}:
        return node
    excluded = _values(negated)
    if excluded is None:
        return node
    left = [v for v in values if not any(_same(v, x) for x in excluded)]
    if not left:
        return node  # no value at all: leave it for the backend to refuse
    out = {k: v for k, v in node.items() if k not in ("not", "const")}
    out["enum"] = left
    return out


def _same(a: Any, b: Any) -> bool:
    """JSON equality (``1 == 1.0``, but ``True != 1``)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _unique_enum_items(node: Schema) -> Schema:
    if node.get("uniqueItems") is not True:
        return node
    lo, hi = node.get("minItems", 0), node.get("maxItems")
    if isinstance(hi, int) and hi <= 1:
        return {k: v for k, v in node.items() if k != "uniqueItems"}  # nothing to repeat
    items = node.get("items")
    if node.get("type") != "array" or not isinstance(items, dict) or not isinstance(lo, int):
        return node
    values = _values(items) if set(items) <= {"enum", "const", "type"} else None
    if values is None and items == {"type": "boolean"}:
        values = [False, True]
    if values is None or any(isinstance(v, dict | list) for v in values):
        return node
    if set(node) - {"type", "items", "minItems", "maxItems", "uniqueItems", *_ANNOTATIONS}:
        return node
    top = len(values) if not isinstance(hi, int) else min(hi, len(values))
    if _count_sequences(len(values), lo, top) > MAX_ALTERNATIVES:
        return node
    branches = [
        {
            "type": "array",
            "prefixItems": [{"const": v} for v in seq],
            "items": False,
            "minItems": len(seq),
        }
        for length in range(lo, top + 1)
        for seq in itertools.permutations(values, length)
    ]
    if not branches:
        return node
    return _kept(node) | {"anyOf": branches}


def _count_sequences(n: int, lo: int, hi: int) -> int:
    total = 0
    for length in range(lo, hi + 1):
        count = 1
        for i in range(length):
            count *= n - i
        total += count
    return total


_ANNOTATIONS = ("title", "description", "default", "examples", "$comment", "$id", "$schema")


def _kept(node: Schema) -> Schema:
    """What a rewritten node keeps beside its ``anyOf``: annotations and definitions."""
    return {k: v for k, v in node.items() if k in (*_ANNOTATIONS, "$defs", "definitions")}


def _branch_of(node: Schema, dropped: tuple[str, ...]) -> Schema:
    """A copy of ``node`` for one ``anyOf`` branch: without ``dropped`` and definitions."""
    return {k: v for k, v in node.items() if k not in (*dropped, "$defs", "definitions")}


def _closed_object(node: Schema) -> bool:
    return node.get("additionalProperties") is False and isinstance(node.get("properties"), dict)


def _without(node: Schema, name: str) -> Schema:
    """The closed object ``node`` with property ``name`` forbidden."""
    out = dict(node)
    out["properties"] = {k: v for k, v in node["properties"].items() if k != name}
    return out


def _requiring(node: Schema, names: list[str]) -> Schema:
    out = dict(node)
    out["required"] = list(dict.fromkeys([*node.get("required", []), *names]))
    return out


def _dependent_required(node: Schema, legacy: bool) -> Schema:
    """``dependentRequired``; and ``dependencies`` with name lists, under drafts 4 to 7 (later
    drafts dropped it, so validators of them ignore it)."""
    deps = node.get("dependentRequired", _MISSING)
    keyword = "dependentRequired"
    if deps is _MISSING and legacy:
        deps, keyword = node.get("dependencies", _MISSING), "dependencies"
        if deps is _MISSING or not isinstance(deps, dict):
            return node
        if not all(isinstance(v, list) for v in deps.values()):
            return node  # schema dependencies: not restated
    if not isinstance(deps, dict) or not _closed_object(node) or node.get("type") != "object":
        return node
    if any(k in node for k in ("anyOf", "oneOf", "allOf", "not")):
        return node
    branches = [_branch_of(node, (keyword,))]
    for trigger, dependents in deps.items():
        if not isinstance(dependents, list) or not all(isinstance(d, str) for d in dependents):
            return node
        grown = []
        for branch in branches:
            if trigger not in branch["properties"]:
                grown.append(branch)  # the trigger is absent in this branch
                continue
            if any(d not in branch["properties"] for d in dependents):
                grown.append(_without(branch, trigger))  # a dependent is absent: so is it
                continue
            grown.append(_requiring(branch, [trigger, *dependents]))
            if trigger not in branch.get("required", []):
                grown.append(_without(branch, trigger))
        branches = [b for b in grown if set(b.get("required", [])) <= set(b["properties"])]
        if not branches:
            return node
        if len(branches) > MAX_ALTERNATIVES:
            return node
    return branches[0] if len(branches) == 1 else _kept(node) | {"anyOf": branches}


def _if_const(node: Schema) -> Schema:
    cond, then, other = node.get("if"), node.get("then", {}), node.get("else", {})
    if not isinstance(cond, dict) or not isinstance(then, dict) or not isinstance(other, dict):
        return node
    if node.get("type") != "object" or not isinstance(node.get("properties"), dict):
        return node
    if any(k in node for k in ("anyOf", "oneOf", "allOf", "not")):
        return node
    props = cond.get("properties")
    if set(cond) - {"properties", "required"} or not isinstance(props, dict) or len(props) != 1:
        return node
    ((name, test),) = props.items()
    if not isinstance(test, dict) or set(test) != {"const"}:
        return node
    cond_required = cond.get("required", [])
    if cond_required not in ([], [name]):
        return node
    if set(then) - {"required"} or set(other) - {"required"}:
        return node
    declared = node["properties"].get(name)
    values = _values(declared) if isinstance(declared, dict) else None
    if values is None and declared == {"type": "boolean"}:
        values = [False, True]
    if values is None or set(declared) - {"enum", "const", "type", *_ANNOTATIONS}:
        return node
    target = test["const"]
    base = _branch_of(node, ("if", "then", "else"))
    present = name in node.get("required", [])
    kept = {k: v for k, v in declared.items() if k not in ("enum", "const")}
    holds = _requiring(
        _with_property(base, name, kept | {"const": target}), then.get("required", [])
    )
    if cond_required:
        holds = _requiring(holds, [name])
    if not any(_same(v, target) for v in values):
        return node  # the condition can only hold with the name absent: not restated
    branches = [holds]
    rest = [v for v in values if not _same(v, target)]
    fails_with = _requiring(base, other.get("required", []))
    if rest:
        branches.append(_requiring(_with_property(fails_with, name, kept | {"enum": rest}), [name]))
    if cond_required and not present:  # absent: the condition fails
        if not _closed_object(node):
            return node
        branches.append(_without(fails_with, name))
    # (absent without ``required`` in the condition: it holds, and the first branch allows it)
    if not branches:
        return node
    return branches[0] if len(branches) == 1 else _kept(node) | {"anyOf": branches}


def _with_property(node: Schema, name: str, schema: Schema) -> Schema:
    out = dict(node)
    out["properties"] = {**node["properties"], name: schema}
    return out
