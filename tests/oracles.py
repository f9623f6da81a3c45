"""Independent checks of a complete output: JSON Schema validation and Python regex matching."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

from jsonschema import Draft202012Validator, validators

# An output checked by no oracle (the reading differs, or the oracle cannot run) gets this
# verdict instead of a reason: it is counted as unchecked, never as valid or invalid.
UNCHECKED = "unchecked"
JSON_WHITESPACE = frozenset(" \t\n\r")


def json_schema_verdict(schema: Any, text: str, *, max_whitespace: int) -> str | None:
    """``None`` if ``text`` is a JSON value valid under ``schema`` with at most
    ``max_whitespace`` consecutive whitespace characters between tokens; otherwise the reason.

    The validator is the schema's declared draft (2020-12 when it declares none), with format
    checking off: formats are annotations by default.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}"
    run = longest_whitespace_run(text)
    if run > max_whitespace:
        return f"a run of {run} whitespace characters (at most {max_whitespace} allowed)"
    try:
        error = next(iter(schema_validator(schema).iter_errors(value)), None)
    except Exception as exc:  # unresolvable refs, regexes Python cannot read, ...
        return f"{UNCHECKED}: the validator failed ({type(exc).__name__}: {exc})"
    return None if error is None else f"{error.message} at {list(error.absolute_path)}"


def is_valid_json_instance(schema: Any, value: Any) -> bool | None:
    """Whether ``value`` is valid under ``schema`` (formats as annotations); None if unknown."""
    try:
        return schema_validator(schema).is_valid(value)
    except Exception:
        return None


def schema_validator(schema: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown $schema URIs fall back to the default draft
        cls = validators.validator_for(schema, default=Draft202012Validator)
    return cls(schema)


def longest_whitespace_run(text: str) -> int:
    """The longest run of JSON whitespace outside strings."""
    longest = current = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char in JSON_WHITESPACE:
            current += 1
            longest = max(longest, current)
        else:
            current = 0
            in_string = char == '"'
    return longest


# --- Regular expressions -----------------------------------------------------------------------

# Both backends read a REGEX guide as Python's ``re`` with ``re.ASCII`` reads it (see
# guidedec.grammar.convert.regex), but for one construct: a flag group holding "i" ((?i),
# (?si:...)), under which llguidance folds case by Unicode rules ((?i)k also matches U+212A
# KELVIN SIGN) where re.ASCII folds ASCII letters only. xgrammar refuses inline flags.
_CASE_INSENSITIVE = re.compile(r"(?<!\\)(?:\\\\)*\(\?[A-Za-z-]*i[A-Za-z-]*[:)]")


def python_regex(pattern: str) -> tuple[re.Pattern[str] | None, str]:
    """The compiled Python reading of ``pattern`` as the backends mean it, or None and why not."""
    if _CASE_INSENSITIVE.search(pattern):
        return None, "(?i): llguidance folds case by Unicode rules, re.ASCII by ASCII ones"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set": Python's reading is meant
            return re.compile(pattern, re.ASCII), ""
    except re.error as exc:
        return None, f"Python's re cannot parse it: {exc}"
