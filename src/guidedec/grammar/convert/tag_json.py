"""JSON schemas inside structural tags: xgrammar's strict reading as a plain schema for
llguidance, its whitespace limit as llguidance options, and whether a value may be a number."""

from __future__ import annotations

from typing import Any

NUMBER_CHARS = "0123456789.eE+-"


def whitespace_options(limit: int) -> dict[str, Any]:
    """llguidance's JSON options for at most ``limit`` whitespace characters in a row."""
    if limit < 1:
        raise ValueError(f"json_schema max_whitespace_cnt must be positive, got {limit}")
    pattern = f"[\\x20\\x0A\\x0D\\x09]{{0,{limit}}}"
    return {"whitespace_flexible": True, "whitespace_pattern": pattern}


def may_be_number(schema: Any) -> bool:
    """Whether a (strict) schema may match a bare JSON number (conservatively true)."""
    if not isinstance(schema, dict):
        return True
    kind = schema.get("type")
    if isinstance(kind, (str, list)):
        kinds = [kind] if isinstance(kind, str) else kind
        return "integer" in kinds or "number" in kinds
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        return any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return True


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def strict_schema(schema: Any) -> Any:
    """Align a schema with how xgrammar compiles structural-tag schemas (strict mode): an object
    with ``properties`` and no ``additionalProperties`` allows no other property (llguidance's
    default allows any), ``prefixItems`` without ``items`` allows no more items, and
    ``properties`` / ``items`` without ``type`` imply an object / an array."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: strict_schema(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(v) for v in out[key]]
    for key in _SCHEMA_ONES:
        if key in out:
            out[key] = strict_schema(out[key])
    if "properties" in out:
        out.setdefault("type", "object")
        if "unevaluatedProperties" not in out:
            out.setdefault("additionalProperties", False)
    if "items" in out or "prefixItems" in out:
        out.setdefault("type", "array")
    if "prefixItems" in out and "unevaluatedItems" not in out:
        out.setdefault("items", False)
    return out
