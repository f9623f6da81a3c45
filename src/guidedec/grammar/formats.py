"""String formats as annotations: a ``format`` a backend does not know is dropped before it
compiles.

JSON Schema makes ``format`` an annotation unless a validator opts in to asserting it, and
guidedec's check of complete outputs does not (:mod:`guidedec.engine.validation`); xgrammar
treats a format it does not know the same way. llguidance refuses the whole schema instead
("Unknown format: int32"): on JSONSchemaBench, OpenAPI's ``int32``, ``int64``, ``double``,
``byte`` and the like made it refuse 82 schemas it otherwise compiles, among them large
Kubernetes and MCP schemas whose xgrammar compile takes seconds. :func:`without_formats` drops
those formats, and only those: no verdict of the check changes, and every format the backend
knows stays enforced.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from guidedec.grammar.schema_walk import map_subschemas


def without_formats(schema_text: str, known: Callable[[str], bool]) -> str:
    """``schema_text`` without the ``format`` keywords whose value ``known`` rejects; the text
    itself when there are none (or it is not JSON). Called once per compile (the result is not
    kept: the compile cache keeps what it produced)."""
    if '"format"' not in schema_text:
        return schema_text
    try:
        root = json.loads(schema_text)
    except (ValueError, RecursionError):
        return schema_text
    try:
        stripped = _walk(root, known)
    except RecursionError:
        return schema_text
    return schema_text if stripped == root else json.dumps(stripped)


def _walk(node: Any, known: Callable[[str], bool]) -> Any:
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, lambda child: _walk(child, known))
    fmt = out.get("format")
    if isinstance(fmt, str) and not known(fmt):
        del out["format"]
    return out
