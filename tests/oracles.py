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

# How Python's ``re`` must read a pattern to mean what each backend means by it, found by probing
# both backends (see the report of tests/test_soundness.py):
# - xgrammar reads \d \w as ASCII (JavaScript semantics), so re.ASCII; but its "." also matches
#   "\n", so re.DOTALL; and its \s is Unicode, which no Python flag set combines with ASCII \d \w.
# - llguidance (Rust regex) reads classes as Unicode like Python, "." without "\n" like Python; but
#   its Unicode \w (UTS #18: marks, Join_Control) and \S (takes \x1c-\x1f) differ from Python's.
_PYTHON_FLAGS = {"xgrammar": re.ASCII | re.DOTALL, "llguidance": 0}
_UNREADABLE = {
    "xgrammar": {r"\s": "xgrammar's \\s is Unicode while its \\d \\w are ASCII"},
    "llguidance": {
        r"\w": "Rust's Unicode \\w takes marks Python's \\w does not",
        r"\W": "Rust's Unicode \\W differs from Python's on marks",
        r"\S": "Rust's \\S takes \\x1c-\\x1f, Python's does not",
        r"\b": "word boundaries follow \\w",
    },
}


def python_regex(pattern: str, backend: str) -> tuple[re.Pattern[str] | None, str]:
    """The compiled Python reading of ``pattern`` as ``backend`` means it, or None and why not."""
    if "[[:" in pattern:
        return None, "POSIX class: Python reads [[:alpha:]] as a nested set"
    for escape, reason in _UNREADABLE[backend].items():
        if _has_escape(pattern, escape):
            return None, reason
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return re.compile(pattern, _PYTHON_FLAGS[backend]), ""
    except re.error as exc:
        return None, f"Python's re cannot parse it: {exc}"


def _has_escape(pattern: str, escape: str) -> bool:
    """Whether ``escape`` (e.g. ``\\w``) occurs unescaped in ``pattern``."""
    return re.search(r"(?<!\\)(?:\\\\)*" + re.escape(escape), pattern) is not None
