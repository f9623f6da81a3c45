"""Objects closed to properties their schema does not name: the rewrite behind
``LLM(disable_additional_properties=True)`` (vLLM's option of the same name; xgrammar's strict
mode and OpenAI's strict schemas do the same).

A JSON schema object that names its ``properties`` and says nothing of others admits any other
property, and a small model writes some: a tool's description as an argument, a default as a
parameter of its own. Closing such objects (``"additionalProperties": false``) keeps every
output valid under the schema as written (it admits fewer of them). Schemas whose objects are
combined (``allOf``, ``if``/``then``/``else``, ``dependentSchemas``, ``unevaluatedProperties``,
``$ref``) are left as they are: closing one part would refuse the properties another part names.
"""

from __future__ import annotations

import json
from typing import Any

from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.grammar.schema_walk import map_subschemas

_COMBINING = frozenset(
    {"allOf", "if", "then", "else", "dependentSchemas", "unevaluatedProperties", "$ref"}
)


def close_objects(schema: Any) -> Any:
    """``schema`` with each object that names its properties, and says nothing of others,
    closed to others; unchanged where objects are combined (see the module's docstring)."""
    if _combines(schema):
        return schema
    return _closed(schema)


def close_every_object(schema: Any) -> Any:
    """``schema`` with each object that names its properties, and says nothing of others,
    closed to others, combined or not: an OpenAI ``strict`` tool, whose caller asked for every
    object closed. ``additionalProperties`` given explicitly is kept."""
    return _closed(schema)


def _closed(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, _closed)
    named = "properties" in out and "patternProperties" not in out
    if named and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _combines(node: Any, depth: int = 0) -> bool:
    if depth > 64:
        return True  # too deep to read with certainty: leave it
    if isinstance(node, dict):
        return bool(_COMBINING & node.keys()) or any(
            _combines(v, depth + 1) for k, v in node.items() if k not in ("enum", "const")
        )
    if isinstance(node, list):
        return any(_combines(v, depth + 1) for v in node)
    return False


def closed_guide(params: GuidedDecodingParams) -> GuidedDecodingParams:
    """The guide with its JSON schema's objects closed (a ``think_first`` guide's too); other
    guides, and schemas the rewrite leaves, as they were."""
    if params.guide_type is GuideType.JSON_SCHEMA:
        schema = json.loads(str(params.guide))
        closed = close_objects(schema)
        return params if closed == schema else GuidedDecodingParams(json_schema=closed)
    if params.think_first:
        tag = json.loads(str(params.guide))
        schema = tag["format"]["elements"][1]["json_schema"]
        closed = close_objects(schema)
        if closed != schema:
            return GuidedDecodingParams(json_schema=closed, think_first=True)
    return params
