"""The JSON type a schema allows at its root, enforced on the first row where a backend does not.

xgrammar drops what it cannot express and keeps the rest: ``{"type": "object", "allOf": [A, B]}``
becomes "any JSON value", and a weak model then writes a number where the schema wants an
object. No later token can repair a root of the wrong type, so the output could only end with
``grammar_error`` (:mod:`guidedec.engine.validation`). The root's type is known from the schema
alone (``type``, ``enum``, ``const``, ``allOf``, ``anyOf``, ``oneOf``) and from a token's first
character that is not whitespace (``{`` an object, ``[`` an array, ``"`` a string, ``-`` or a
digit a number, ``t`` / ``f`` a boolean, ``n`` null): on such an output's rows before its first
character that is not whitespace, the decoder forbids the tokens that start a value of another
type. Every instance the schema
accepts starts with an allowed character, so no valid output is lost. The restriction is a row
rule (:class:`guidedec.decoder.row_rules.RootTypeRule`): it applies to every row of the output,
sampled, drafted or verified alike.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from guidedec.grammar.auto_policy import XGRAMMAR
from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.grammar.schema_walk import json_type
from guidedec.tokenizer import TokenizerInfo

FIRST_CHARS = {
    "object": "{",
    "array": "[",
    "string": '"',
    "number": "-0123456789",
    "integer": "-0123456789",
    "boolean": "tf",
    "null": "n",
}
"""The characters a JSON value of each type starts with."""
_BITS_PER_WORD = 32
"""Tokens per int32 word of a bitmask row (the layout :mod:`guidedec.bitmask.layout` documents,
which the grammar layer writes without importing)."""
KINDS = ("object", "array", "string", "number", "boolean", "null")
MAX_DEPTH = 16
GUIDES_KEPT = 256


def root_types(schema: Any, depth: int = 0) -> frozenset[str] | None:
    """The JSON types (of :data:`KINDS`; ``integer`` counts as ``number``) an instance of
    ``schema`` can have, or None when the schema does not say (any type)."""
    if schema is False:
        return frozenset()
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    found: frozenset[str] | None = None

    def narrow(types: frozenset[str] | None) -> None:
        nonlocal found
        if types is not None:
            found = types if found is None else found & types

    declared = schema.get("type")
    names = [declared] if isinstance(declared, str) else declared
    if isinstance(names, list) and all(isinstance(name, str) for name in names):
        narrow(frozenset(_kind(name) for name in names if name in FIRST_CHARS))
    if isinstance(schema.get("enum"), list):
        narrow(frozenset(_value_kind(value) for value in schema["enum"]))
    if "const" in schema:
        narrow(frozenset({_value_kind(schema["const"])}))
    members = schema.get("allOf")
    if isinstance(members, list):
        for member in members:
            narrow(root_types(member, depth + 1))
    for key in ("anyOf", "oneOf"):
        members = schema.get(key)
        if isinstance(members, list) and members:
            branches = [root_types(member, depth + 1) for member in members]
            if all(branch is not None for branch in branches):
                narrow(frozenset().union(*branches))  # type: ignore[arg-type]
    return found


def _kind(name: str) -> str:
    return "number" if name == "integer" else name


def _value_kind(value: Any) -> str:
    return _kind(json_type(value))


@dataclass(frozen=True)
class FirstCharRows:
    """Per JSON type, the bitmask row of the tokens whose first character that is not
    whitespace starts a value of that type (a tokenizer's, built once)."""

    rows: dict[str, npt.NDArray[np.int32]]

    @classmethod
    def of(cls, tokenizer: TokenizerInfo, texts: tuple[str, ...]) -> FirstCharRows:
        return tokenizer.backend_object("first-chars", lambda: cls._build(tokenizer, texts))

    @classmethod
    def _build(cls, tokenizer: TokenizerInfo, texts: tuple[str, ...]) -> FirstCharRows:
        firsts = [text.lstrip()[:1] for text in texts]
        words = -(-tokenizer.vocab_size // _BITS_PER_WORD)
        rows = {}
        for kind in KINDS:
            chars = FIRST_CHARS[kind]
            bits = np.zeros(words * _BITS_PER_WORD, dtype=np.bool_)
            bits[: len(firsts)] = [bool(first) and first in chars for first in firsts]
            rows[kind] = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
        return cls(rows)

    def forbidden(self, allowed: frozenset[str]) -> npt.NDArray[np.int32]:
        """The row of the tokens that start a value of a type outside ``allowed``."""
        out = np.zeros_like(self.rows["object"])
        for kind in KINDS:
            if kind not in allowed:
                out |= self.rows[kind]
        return out


class RootTypes:
    """The rows that the root-type restriction forbids, per guide, for one tokenizer (built at
    first use and kept for ``GUIDES_KEPT`` guides): the per-request rule that applies them is
    :class:`guidedec.decoder.row_rules.RootTypeRule`."""

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self._tokenizer = tokenizer
        self._forbidden: OrderedDict[str, npt.NDArray[np.int32] | None] = OrderedDict()
        self._texts: tuple[str, ...] = ()

    def warm_up(self) -> None:
        """Build the tokenizer's first-character rows (~0.2 s) now rather than at the first
        restricted request."""
        self._first_chars()

    @property
    def texts(self) -> tuple[str, ...]:
        """Each token's text (the decoded vocabulary closing reads too)."""
        if not self._texts:
            self._texts = self._tokenizer.token_texts()
        return self._texts

    def _first_chars(self) -> FirstCharRows:
        return FirstCharRows.of(self._tokenizer, self.texts)

    def forbidden(self, params: GuidedDecodingParams, backend: str) -> npt.NDArray[np.int32] | None:
        """The row of the tokens that the first rows of an output of ``params`` must not allow:
        those that start a value of a type its schema excludes, where the guide is a JSON schema
        that names its root types and ``backend`` is xgrammar (the backend that approximates);
        None where nothing is to be restricted."""
        if params.guide_type is not GuideType.JSON_SCHEMA or backend != XGRAMMAR:
            return None
        assert isinstance(params.guide, str)
        return self._row(params.guide)

    def _row(self, schema_text: str) -> npt.NDArray[np.int32] | None:
        if schema_text in self._forbidden:
            self._forbidden.move_to_end(schema_text)
            return self._forbidden[schema_text]
        try:
            types = root_types(json.loads(schema_text))
        except (ValueError, RecursionError):
            types = None
        row = None
        if types and types != frozenset(KINDS):
            row = self._first_chars().forbidden(types)
        self._forbidden[schema_text] = row
        if len(self._forbidden) > GUIDES_KEPT:
            self._forbidden.popitem(last=False)
        return row
