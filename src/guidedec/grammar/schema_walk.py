"""Reading JSON schemas: their sub-schemas, local ``$ref`` s, the types they admit, whether two
of them exclude each other, and whether a ``pattern`` is anchored. Used by the ``auto`` policy, the
guide limits, the root types and the format drop (:mod:`guidedec.grammar.formats`); no backend
involved."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

Schema = dict[str, Any]

# Where sub-schemas sit: a schema, a list of schemas, or a map of names to schemas.
_SCHEMA_KEYS = (
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
)
_LIST_KEYS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP_KEYS = ("properties", "patternProperties", "dependentSchemas", "dependencies")


def resolve_ref(ref: str, root: Any) -> Any:
    """The target of a local ``$ref`` (``#`` or a JSON pointer ``#/a/b``), or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def subschemas(node: Schema) -> Iterator[Any]:
    """The sub-schemas directly inside ``node`` (definitions only count once referenced).
    ``propertyNames`` gets ``type: string``: it only ever sees names."""
    for key in _SCHEMA_KEYS:
        if isinstance(node.get(key), dict):
            yield node[key]
    names = node.get("propertyNames")
    if isinstance(names, dict) and "type" not in names:
        yield {**names, "type": "string"}
    for key in _LIST_KEYS:
        if isinstance(node.get(key), list):
            yield from node[key]
    for key in _MAP_KEYS:
        if isinstance(node.get(key), dict):
            yield from node[key].values()


def map_subschemas(node: Schema, change: Callable[[Any], Any]) -> Schema:
    """A copy of ``node`` with ``change`` applied to each sub-schema directly inside it, in every
    place one may sit: those :func:`subschemas` reads, ``propertyNames`` as written, and the
    definitions (``$defs``, ``definitions``)."""
    out = dict(node)
    for key in (*_SCHEMA_KEYS, "propertyNames"):
        if isinstance(out.get(key), dict):
            out[key] = change(out[key])
    for key in _LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [change(child) for child in out[key]]
    for key in (*_MAP_KEYS, "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {name: change(child) for name, child in out[key].items()}
    return out


def reachable_schemas(root: Any) -> Iterator[Schema]:
    """Every schema object reachable from ``root``, following local ``$ref`` s, once each."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(subschemas(node))
        if isinstance(node.get("$ref"), str):
            stack.append(resolve_ref(node["$ref"], root))


def types_of(node: Any, root: Any) -> frozenset[str] | None:
    """The JSON types a schema admits, as far as its ``type``/``const``/``enum`` say (None: any).
    ``number`` includes ``integer``."""
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        node = resolve_ref(node["$ref"], root)
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return frozenset({json_type(node["const"])})
    if isinstance(node.get("enum"), list):
        return frozenset(json_type(v) for v in node["enum"])
    declared = node.get("type")
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not names:
        return None
    expanded = {str(t) for t in names} | ({"integer"} if "number" in names else set())
    return frozenset(expanded)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


# --- oneOf: exact as anyOf when no instance can match two branches --------------------------


def values_of(node: Any, root: Any) -> frozenset[str] | None:
    """The values a schema allows by ``const``/``enum`` (as JSON text), or None."""
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        node = resolve_ref(node["$ref"], root)
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return frozenset({json.dumps(node["const"], sort_keys=True)})
    if isinstance(node.get("enum"), list):
        return frozenset(json.dumps(v, sort_keys=True) for v in node["enum"])
    return None


def exclusive(a: Any, b: Any, root: Any) -> bool:
    """Whether no instance can be valid under both schemas (a sufficient check)."""
    types_a, types_b = types_of(a, root), types_of(b, root)
    if types_a is not None and types_b is not None and not types_a & types_b:
        return True
    values_a, values_b = values_of(a, root), values_of(b, root)
    if values_a is not None and values_b is not None and not values_a & values_b:
        return True
    return objects_exclusive(deref(a, root), deref(b, root), root)


def deref(node: Any, root: Any) -> Any:
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        return resolve_ref(node["$ref"], root)
    return node


def objects_exclusive(a: Any, b: Any, root: Any) -> bool:
    """Object branches told apart by a property both require with disjoint values, or by a
    property one requires and the other forbids."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return (
        forbids_required(a, b)
        or forbids_required(b, a)
        or any(exclusive_property(a, b, name, root) for name in required(a) & required(b))
    )


def required(node: Schema) -> set[str]:
    names = node.get("required")
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def property_names(node: Schema) -> set[str]:
    props = node.get("properties")
    return set(props) if isinstance(props, dict) else set()


def exclusive_property(a: Schema, b: Schema, name: str, root: Any) -> bool:
    props_a, props_b = a.get("properties"), b.get("properties")
    if not isinstance(props_a, dict) or not isinstance(props_b, dict):
        return False
    if name not in props_a or name not in props_b:
        return False
    values_a, values_b = values_of(props_a[name], root), values_of(props_b[name], root)
    return values_a is not None and values_b is not None and not values_a & values_b


def forbids_required(a: Schema, b: Schema) -> bool:
    """``a`` requires a property that ``b`` does not allow (``additionalProperties: false``)."""
    if b.get("additionalProperties") is not False or "patternProperties" in b:
        return False
    return bool(required(a) - property_names(b))


# --- pattern: searching equals matching whole when every alternative is anchored ------------


def anchored(pattern: str) -> bool:
    """Whether every top-level alternative of ``pattern`` is ``^...$`` (optionally inside one
    group), so that searching for it and matching it whole are the same."""
    return all(anchored_alternative(alt) for alt in top_level_alternatives(pattern))


def top_level_alternatives(pattern: str) -> list[str]:
    """``pattern`` split at the ``|`` outside groups and character classes."""
    parts, start = [], 0
    for i, depth in regex_depths(pattern):
        if depth == 0 and pattern[i] == "|":
            parts.append(pattern[start:i])
            start = i + 1
    return [*parts, pattern[start:]]


def regex_depths(pattern: str) -> Iterator[tuple[int, int]]:
    """``(index, group depth)`` of every character outside escapes and character classes,
    the depth counted after the character."""
    depth, in_class, escaped = 0, False, False
    for i, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        else:
            depth += {"(": 1, ")": -1}.get(char, 0)
            yield i, depth


def anchored_alternative(alternative: str) -> bool:
    while encloses(alternative):
        inner = alternative[1:-1]
        alternative = inner[2:] if inner.startswith("?:") else inner
    return (
        alternative.startswith("^")
        and alternative.endswith("$")
        and not alternative.endswith("\\$")
        and len(top_level_alternatives(alternative)) == 1
    )


def encloses(pattern: str) -> bool:
    """Whether ``pattern`` is one group: its first ``(`` closes at its last character."""
    if not (pattern.startswith("(") and pattern.endswith(")")):
        return False
    closed_at = next((i for i, depth in regex_depths(pattern) if depth == 0), None)
    return closed_at == len(pattern) - 1
