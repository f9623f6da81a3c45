"""Exact or explicit: a JSON output is checked against its full schema before it ends ``stop``.

A backend may enforce a schema only approximately (xgrammar's ``not``, ``if``/``then``, an
overlapping ``oneOf``; see :mod:`guidedec.grammar.auto_policy`), so an output its grammar
completes can still break the schema. The engine checks every complete JSON-schema output with
``jsonschema`` (formats are annotations, as the specification says) and ends one that breaks it
with ``grammar_error`` and a message naming the keyword and the path, never with ``stop``.
"""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from guidedec.grammar.params import GuidedDecodingParams, GuideType

VALIDATORS_KEPT = 256
"""Compiled validators kept (least recently used first out)."""


class OutputValidator:
    """Checks complete outputs of JSON guides; keeps a validator per schema."""

    def __init__(self) -> None:
        self._validators: OrderedDict[object, _Validator | None] = OrderedDict()

    def problem(self, params: GuidedDecodingParams, text: str) -> str | None:
        """Why ``text``, a complete output of ``params``, breaks its guide; None when it does
        not (or when no check applies: a guide other than JSON, a schema ``jsonschema`` cannot
        evaluate)."""
        kind = params.guide_type
        if kind not in (GuideType.JSON_SCHEMA, GuideType.JSON_OBJECT):
            return None
        try:
            value = json.loads(text)
        except ValueError as exc:
            return f"the output is not JSON ({exc})"
        if kind is GuideType.JSON_OBJECT:
            return None if isinstance(value, dict) else "the output is not a JSON object"
        error = next(self.errors(params, value), None)
        return None if error is None else describe_error(error)

    def errors(self, params: GuidedDecodingParams, instance: Any) -> Iterator[Any]:
        """The ``jsonschema`` errors of ``instance`` under a JSON-schema guide, lazily; none
        where ``jsonschema`` cannot judge: an unresolvable ``$ref``, a pattern Python cannot
        read, a schema that breaks its metaschema (``{"required": "name"}`` would report a
        missing ``n``). The metaschema check runs once per schema, and only when an error turns
        up: it costs more than validating most outputs (about 0.9 ms against 30 us)."""
        entry = self._entry(params)
        if entry is None:
            return
        try:
            for error in entry.validator.iter_errors(instance):
                if not entry.readable():
                    return
                yield error
        except Exception:  # an unresolvable $ref, a pattern Python cannot read: cannot judge
            return

    def _entry(self, params: GuidedDecodingParams) -> _Validator | None:
        """The compiled validator of a JSON-schema guide (None if ``jsonschema`` cannot read
        the schema's draft)."""
        key = (params.guide_type, params.guide)  # cheap; equal schemas spelt apart: two entries
        if key in self._validators:
            self._validators.move_to_end(key)
            return self._validators[key]
        entry = _compile(params)
        self._validators[key] = entry
        if len(self._validators) > VALIDATORS_KEPT:
            self._validators.popitem(last=False)
        return entry


class _Validator:
    """A schema's validator, and whether the schema itself is valid (checked at first need)."""

    __slots__ = ("_readable", "validator")

    def __init__(self, validator: Any) -> None:
        self.validator = validator
        self._readable: bool | None = None

    def readable(self) -> bool:
        """Whether the schema passes its metaschema (checked once)."""
        if self._readable is None:
            try:
                self.validator.check_schema(self.validator.schema)
                self._readable = True
            except Exception:  # not a schema jsonschema can read: nothing to check against
                self._readable = False
        return self._readable


def describe_error(error: Any) -> str:
    """A ``jsonschema`` error as guidedec reports it: where, which keyword, what."""
    path = "".join(f"/{part}" for part in error.absolute_path) or "/"
    return (
        f"the output breaks its schema at {path} (keyword {error.validator!r}): "
        f"{error.message[:200]}"
    )


def schema_validator(schema: Any) -> Any:
    """A ``jsonschema`` validator of the schema's declared draft (2020-12 by default); formats
    are annotations. Raises what ``jsonschema`` raises for a schema it cannot read."""
    from jsonschema import Draft202012Validator, validators

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown $schema URIs fall back to the default draft
        cls = validators.validator_for(schema, default=Draft202012Validator)
    return cls(schema)


def _compile(params: GuidedDecodingParams) -> _Validator | None:
    guide = params.guide
    try:
        return _Validator(schema_validator(json.loads(guide) if isinstance(guide, str) else guide))
    except Exception:  # not a schema jsonschema can read: nothing to check against
        return None
