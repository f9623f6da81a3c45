"""The benchmarks' shared inputs: (JSON schema, instance) pairs (structural positions give sparse
mask rows, string contents give dense ones), the person schema of the end-to-end runs, guides
whose outputs commit to long completions (closing's window), and where the public test data
lives."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SHARED_DATA = Path(
    os.environ.get("GUIDEDEC_DATA") or Path(__file__).resolve().parents[4] / "shared" / "data"
)
"""The public test data (JSON-Schema-Test-Suite, JSONSchemaBench, grammars): ``shared/data``
beside the source checkout, or the folder ``$GUIDEDEC_DATA`` names."""

PERSON_SCHEMA: dict[str, Any] = {
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "active", "tags"],
    "additionalProperties": False,
}
"""``examples/person.schema.json`` (without its ``$schema``): the end-to-end benchmarks' item."""


def person_array_schema(tokens: int) -> dict[str, Any]:
    """An array of at least ``tokens + 1`` persons: no output of ``tokens`` tokens completes it
    (every item takes at least one token), so guided requests always run to ``max_tokens``."""
    return {"type": "array", "items": PERSON_SCHEMA, "minItems": tokens + 1}


JSON_CASES: list[tuple[dict[str, Any], Any]] = [
    (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "age", "tags"],
        },
        {"name": "Ada Lovelace", "age": 36, "tags": ["mathematician", "writer"]},
    ),
    (
        {
            "type": "object",
            "properties": {
                "sku": {"type": "string"},
                "price": {"type": "number"},
                "in_stock": {"type": "boolean"},
                "category": {"enum": ["book", "music", "film"]},
                "dimensions": {
                    "type": "object",
                    "properties": {"w": {"type": "number"}, "h": {"type": "number"}},
                    "required": ["w", "h"],
                },
            },
            "required": ["sku", "price", "in_stock", "category", "dimensions"],
        },
        {
            "sku": "BK-0042",
            "price": 12.5,
            "in_stock": True,
            "category": "book",
            "dimensions": {"w": 13.2, "h": 20.3},
        },
    ),
    (
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "date": {"type": "string"},
                    "event": {"type": "string"},
                    "attendees": {"type": "integer", "minimum": 0},
                },
                "required": ["date", "event", "attendees"],
            },
        },
        [
            {"date": "2024-05-01", "event": "Launch review", "attendees": 12},
            {"date": "2024-05-03", "event": "Retrospective, part two", "attendees": 7},
        ],
    ),
    (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "summary": {"type": "string"},
                "rating": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            "required": ["title", "summary", "rating"],
        },
        {
            "title": "A short review",
            "summary": "The kernel skips words that are all allowed, fills rows that are mostly "
            "forbidden in bulk and only unpacks the few words in between.",
            "rating": 4,
        },
    ),
]


COMMITTING_CASES: dict[str, tuple[dict[str, Any], int]] = {
    "a name owing 100 items": (
        {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "bbbb": {"type": "array", "items": {"type": "integer"}, "minItems": 100},
            },
            "additionalProperties": False,
        },
        90,
    ),
    "30 arrays of 30 integers": (
        {
            "type": "object",
            "properties": {
                "a": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "integer"}, "minItems": 30},
                    "minItems": 30,
                }
            },
            "required": ["a"],
        },
        2048,
    ),
}
"""Name -> (schema, max_tokens): guides whose outputs can commit to more tokens than closing's
default 64-token window holds, with a budget that the shortest completion fits: after ``"b`` the
first owes an array of 100 items (``{}`` fits 90 tokens); the second owes about a thousand
tokens from its first."""

COMMITTING_GRAMMARS: dict[str, tuple[str, int]] = {
    "an EBNF item owing 100 tokens": ('root ::= "x" ("y" | "z" ("0 "){100})* "."', 90),
}
"""Name -> (EBNF grammar, max_tokens), as :data:`COMMITTING_CASES`: after a ``z`` the output owes
a hundred ``0`` s, more than its budget (``xy.`` fits it)."""
