"""Sixty sentences, each naming one person's name, age, city and occupation, with those facts:
the extraction task of ``guidedec bench quality`` and of the real-model tests. Written for
guidedec (the people are invented; the data is ``extraction.jsonl`` beside this module); the
phrasing varies on purpose (the age before or after the name, in words of its own, the city
early or late)."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any, TypedDict


class Person(TypedDict):
    name: str
    age: int
    city: str
    occupation: str


FIELDS = ("name", "age", "city", "occupation")
"""The record's keys, in the order the instruction names them."""


def _load() -> list[tuple[str, Person]]:
    text = files("guidedec.bench").joinpath("extraction.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [(row["sentence"], {k: row[k] for k in FIELDS}) for row in rows]  # type: ignore[misc]


EXTRACTION: list[tuple[str, Person]] = _load()
"""(sentence, its facts)."""

_TYPES = {"name": "string", "age": "integer", "city": "string", "occupation": "string"}


def record_schema(keys: tuple[str, ...] = FIELDS) -> dict[str, Any]:
    """The JSON schema of one person's record, its properties in the order ``keys`` (both
    backends make the output follow the schema's order)."""
    return {
        "type": "object",
        "properties": {k: {"type": _TYPES[k]} for k in keys},
        "required": list(keys),
        "additionalProperties": False,
    }


SCHEMA = record_schema()
"""The JSON schema of one person's record."""


def instruction(sentence: str) -> str:
    """The user message asking for the record of ``sentence``."""
    return (
        "Extract the person's name, age, city and occupation from this sentence as JSON with "
        f'the keys "name", "age", "city" and "occupation": {sentence}'
    )
