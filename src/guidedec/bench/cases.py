"""(JSON schema, instance) pairs shared by the benchmarks: structural positions give sparse
mask rows, string contents give dense ones."""

from __future__ import annotations

from typing import Any

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
