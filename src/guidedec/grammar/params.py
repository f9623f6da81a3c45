"""What a request asks its output to follow: the guide type and the guide itself."""

from __future__ import annotations

import enum
import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

Guide = str | tuple[str, ...] | None


class GuideType(enum.Enum):
    """The kinds of guide guidedec enforces, on every backend.

    JSON_OBJECT: any JSON object. JSON_SCHEMA: a JSON value valid under a JSON Schema.
    REGEX: a full match of a regular expression, read as ``re.fullmatch(pattern, text, re.ASCII)``
    reads it (``.`` excludes ``"\\n"``, ``\\d \\w \\s`` are ASCII; see
    :mod:`guidedec.grammar.convert.regex`). EBNF: a GBNF/EBNF grammar in the dialect of xgrammar
    and llama.cpp (root rule ``root``). LARK: a Lark grammar (llguidance's dialect, root rule
    ``start``). CHOICE: exactly one of a list of strings. STRUCTURAL_TAG: free text with
    structured segments, in xgrammar's structural-tag format.
    """

    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF = "ebnf"
    LARK = "lark"
    CHOICE = "choice"
    STRUCTURAL_TAG = "structural_tag"


@dataclass(frozen=True)
class GuidedDecodingParams:
    """One request's guide: set exactly one field.

    Args:
        json_object: Any JSON object.
        json_schema: A JSON Schema, as a dict or a JSON string.
        regex: A regular expression the whole output must match, as Python's ``re.fullmatch``
            with ``re.ASCII`` reads it.
        ebnf: An EBNF/GBNF grammar (xgrammar / llama.cpp dialect).
        lark: A Lark grammar (llguidance dialect).
        choice: The allowed outputs, as literal strings.
        structural_tag: An xgrammar structural tag, as a dict or a JSON string.
        think_first: With ``json_schema`` (of an object or an array) or ``json_object``: the
            output may start with free text, its thinking, before the JSON value, which the
            guide holds as before; the free text cannot hold the value's opening ``{`` (or
            ``[``), so the value starts at the first one. The engine returns the free text as
            the output's ``reasoning`` and the value as its ``text``. A model asked to think
            before it answers keeps doing so (see the docs' answer quality section); the guide
            is a structural tag (free text, then the schema), so the schema is enforced as
            structural tags enforce theirs.

    Raises:
        ValueError: if no field or more than one field is set, or a field has the wrong type,
            or ``think_first`` is set with another guide or a schema of another type.
            Whether the guide itself compiles is checked later, per request, by the backend.
    """

    json_object: bool = False
    json_schema: dict[str, Any] | str | None = None
    regex: str | None = None
    ebnf: str | None = None
    lark: str | None = None
    choice: Sequence[str] | None = None
    structural_tag: dict[str, Any] | str | None = None
    think_first: bool = False
    _type: GuideType = field(init=False, repr=False, compare=False)
    _guide: Guide = field(init=False, repr=False, compare=False)
    _cache_key: Hashable | None = field(default=None, init=False, repr=False, compare=False)
    """Set by :func:`guidedec.grammar.cache.guide_cache_key` at its first call."""
    _opener: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        guide_type, guide = _resolve(self)
        if self.think_first:
            guide, opener = _thinking_tag(guide_type, guide)
            guide_type = GuideType.STRUCTURAL_TAG
            object.__setattr__(self, "_opener", opener)
        object.__setattr__(self, "_type", guide_type)
        object.__setattr__(self, "_guide", guide)

    @property
    def guide_type(self) -> GuideType:
        """The one guide type that is set."""
        return self._type

    @property
    def guide(self) -> Guide:
        """The guide as text: the schema or structural tag as a JSON string, the choices as a
        tuple of strings, ``None`` for JSON_OBJECT."""
        return self._guide

    @property
    def answer_opener(self) -> str | None:
        """With ``think_first``: the character the JSON value starts with (``{`` or ``[``);
        None otherwise."""
        return self._opener

    def __hash__(self) -> int:
        return hash((self._type, self._guide))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GuidedDecodingParams):
            return NotImplemented
        return (self._type, self._guide) == (other._type, other._guide)


def _resolve(params: GuidedDecodingParams) -> tuple[GuideType, Guide]:
    set_fields: list[tuple[GuideType, Any]] = []
    if params.json_object:
        set_fields.append((GuideType.JSON_OBJECT, None))
    for guide_type in GuideType:
        if guide_type is GuideType.JSON_OBJECT:
            continue
        value = getattr(params, guide_type.value)
        if value is not None:
            set_fields.append((guide_type, value))
    if len(set_fields) != 1:
        names = [t.value for t, _ in set_fields] or ["none"]
        raise ValueError(
            "GuidedDecodingParams needs exactly one guide "
            f"(json_object, json_schema, regex, ebnf, lark, choice, structural_tag); got {names}"
        )
    guide_type, value = set_fields[0]
    return guide_type, _normalise(guide_type, value)


def _thinking_tag(guide_type: GuideType, guide: Guide) -> tuple[str, str]:
    """The structural tag of a ``think_first`` guide (free text without the value's opener,
    then the value), and the opener."""
    if guide_type is GuideType.JSON_OBJECT:
        schema: Any = {"type": "object"}
    elif guide_type is GuideType.JSON_SCHEMA:
        try:
            schema = json.loads(str(guide))
        except ValueError as exc:
            raise ValueError(f"json_schema is not JSON: {exc}") from None
    else:
        raise ValueError(
            f"think_first goes with json_schema or json_object, not {guide_type.value}"
        )
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind not in ("object", "array"):
        raise ValueError(
            "think_first needs a schema whose value is an object or an array "
            f'("type": "object" or "array"), got type {kind!r}'
        )
    opener = "[" if kind == "array" else "{"
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [
                {"type": "regex", "pattern": "[^\\[]*" if kind == "array" else "[^{]*"},
                {"type": "json_schema", "json_schema": schema},
            ],
        },
    }
    return json.dumps(tag, ensure_ascii=False), opener


def _normalise(guide_type: GuideType, value: Any) -> Guide:
    if guide_type is GuideType.JSON_OBJECT:
        return None
    if guide_type in (GuideType.JSON_SCHEMA, GuideType.STRUCTURAL_TAG):
        if isinstance(value, dict):
            try:
                return json.dumps(value, ensure_ascii=False)
            except RecursionError:
                raise ValueError(f"{guide_type.value} nests too deeply to be read") from None
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{guide_type.value} is not JSON: {exc}") from None
        if isinstance(value, str):
            return value
        raise ValueError(
            f"{guide_type.value} must be a dict or a JSON string, got {type(value).__name__}"
        )
    if guide_type is GuideType.CHOICE:
        if isinstance(value, str) or not all(isinstance(c, str) for c in value):
            raise ValueError("choice must be a sequence of strings")
        return tuple(value)
    if not isinstance(value, str):
        raise ValueError(f"{guide_type.value} must be a string, got {type(value).__name__}")
    return value
