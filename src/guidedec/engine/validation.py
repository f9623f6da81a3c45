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
from typing import Any

from guidedec.grammar.params import GuidedDecodingParams, GuideType

VALIDATORS_KEPT = 256
"""Compiled validators kept (least recently used first out)."""


class OutputValidator:
    """Checks complete outputs of JSON guides; keeps a validator per schema."""

    def __init__(self) -> None:
        self._validators: OrderedDict[object, Any] = OrderedDict()

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
        validator = self.validator_for(params)
        if validator is None:
            return None
        try:
            error = next(iter(validator.iter_errors(value)), None)
        except Exception:  # an unresolvable $ref, a pattern Python cannot read: cannot judge
            return None
        return None if error is None else describe_error(error)

    def validator_for(self, params: GuidedDecodingParams) -> Any:
        """The ``jsonschema`` validator of a JSON-schema guide (None if it cannot judge)."""
        key = (params.guide_type, params.guide)  # cheap; equal schemas spelt apart: two entries
        if key in self._validators:
            self._validators.move_to_end(key)
            return self._validators[key]
        validator = _compile(params)
        self._validators[key] = validator
        if len(self._validators) > VALIDATORS_KEPT:
            self._validators.popitem(last=False)
        return validator


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


def _compile(params: GuidedDecodingParams) -> Any:
    guide = params.guide
    try:
        validator = schema_validator(json.loads(guide) if isinstance(guide, str) else guide)
        validator.check_schema(validator.schema)
        return validator
    except Exception:  # not a schema jsonschema can read: nothing to check against
        return None
