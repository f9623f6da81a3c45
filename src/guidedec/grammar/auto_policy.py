"""The policy of ``backend="auto"``: which backend to try first for a guide.

xgrammar's masks are several times faster, so it goes first whenever it enforces the guide
exactly. It accepts every JSON schema but silently approximates what it lacks (accepting invalid
output or rejecting valid output), while llguidance refuses what it cannot enforce. So a JSON
schema goes to llguidance first when :func:`xgrammar_inexact_reason` finds a construct that
xgrammar 0.2 is known, by measurement, to get wrong; if llguidance refuses it, xgrammar's
approximation is still better than nothing. Each rule names the construct and the failure
(FP: invalid output accepted, FN: valid output rejected). A schema whose xgrammar grammar would
take seconds to compile also goes to llguidance first (:func:`xgrammar_too_costly`). Measured on
JSONSchemaBench with xgrammar 0.2.9 and llguidance 1.9.1: see ``docs/auto-backend.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from itertools import combinations
from typing import Any

from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.grammar.schema_rewrite import rewrite_for_xgrammar
from guidedec.grammar.schema_walk import (
    Schema,
    anchored,
    exclusive,
    json_type,
    property_names,
    reachable_schemas,
    required,
    resolve_ref,
    types_of,
)

XGRAMMAR = "xgrammar"
LLGUIDANCE = "llguidance"

# Keywords xgrammar 0.2 accepts and ignores (FP), whatever their value.
XGRAMMAR_INEXACT_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
        # Not resolved: the reference accepts anything (FP; JSON-Schema-Test-Suite dynamicRef).
        "$dynamicRef",
        # Matched as a full match, not a search (FN); with "properties" alongside, extra
        # properties escape both (FP).
        "patternProperties",
    }
)
# String formats xgrammar checks more loosely or more strictly than the standard (measured:
# "date"/"date-time" take 2024-02-30, "email" rejects a@[127.0.0.1], "uri" rejects http://[::1]/,
# "hostname" takes 64-letter labels, "ipv4" takes 01.2.3.4, "uri-reference" rejects absolute
# URIs). Its "time", "uuid" and "duration" are exact; formats it does not know are annotations.
XGRAMMAR_INEXACT_FORMATS = frozenset(
    {"date", "date-time", "email", "uri", "uri-reference", "hostname", "ipv4", "ipv6"}
)
XGRAMMAR_STRING_FORMATS = XGRAMMAR_INEXACT_FORMATS | {"time", "uuid", "duration"}
# Every keyword that constrains an instance (anything else is an annotation or unknown, which
# validators ignore).
VALIDATION_KEYWORDS = frozenset(
    {
        *XGRAMMAR_INEXACT_KEYWORDS,
        "type",
        "enum",
        "const",
        "nullable",
        "$ref",
        "allOf",
        "anyOf",
        "oneOf",
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    }
)
# Keywords that xgrammar ignores (FP) unless ``type`` names their type (``format`` is left out:
# on other types it is an annotation, such as OpenAPI's ``int32``).
_TYPED_KEYWORDS = {
    "string": ("minLength", "maxLength", "pattern"),
    "array": ("minItems", "maxItems"),
    "object": ("minProperties", "maxProperties"),
}
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
# Above this many costly rules, xgrammar's compile takes seconds (see xgrammar_too_costly).
XGRAMMAR_MAX_COSTLY_RULES = 150
# A string allowed more characters than this is free text (see string_reason).
FREE_TEXT_MAX_LENGTH = 1000
_LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")

# --- The rules ---------------------------------------------------------------------------------


def validation_siblings(node: Schema, keyword: str) -> list[str]:
    return sorted(k for k in node if k in VALIDATION_KEYWORDS and k != keyword)


def combinator_reason(node: Schema, root: Any) -> str | None:
    """allOf/anyOf/oneOf: xgrammar drops their sibling keywords and merges only a one-branch
    allOf (FP); it enforces oneOf as anyOf (FP unless the branches exclude each other)."""
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = node.get(keyword)
        if not isinstance(branches, list):
            continue
        siblings = validation_siblings(node, keyword)
        if siblings:
            return f"{keyword} beside {', '.join(siblings)}"
        if keyword == "allOf" and len(branches) > 1:
            return "allOf with several branches"
        if keyword == "oneOf" and not all(
            exclusive(a, b, root) for a, b in combinations(branches, 2)
        ):
            return "oneOf whose branches overlap"
    return None


def ref_reason(node: Schema, root: Any) -> str | None:
    """$ref: xgrammar ignores keywords beside it, and anything it cannot resolve (FP)."""
    ref = node.get("$ref")
    if ref is None:
        return None
    if not isinstance(ref, str) or resolve_ref(ref, root) is None:
        return f"$ref {ref!r} is not a local JSON pointer"
    if ref == "#":  # measured on Github_easy o58637: a mask forbids a token accept_token takes
        return "$ref '#' (recursion through the root): xgrammar's masks disagree with its matcher"
    siblings = validation_siblings(node, "$ref")
    return f"$ref beside {', '.join(siblings)}" if siblings else None


def object_reason(node: Schema, root: Any) -> str | None:
    """required: xgrammar ignores required names that ``properties`` does not list (FP)."""
    missing = sorted(required(node) - property_names(node))
    return f"required {missing} not in properties" if missing else None


def untyped_reason(node: Schema, root: Any) -> str | None:
    """String, array, object and number keywords are ignored without their ``type`` (FP)."""
    for json_type_name, keywords in _TYPED_KEYWORDS.items():
        present = [k for k in keywords if k in node]
        if present and not admits(node, json_type_name):
            return f"{present[0]} without type {json_type_name}"
    present = [k for k in NUMBER_KEYWORDS if k in node]
    if present and not (admits(node, "number") or admits(node, "integer")):
        return f"{present[0]} without a numeric type"
    return None


def string_reason(node: Schema, root: Any) -> str | None:
    """pattern: xgrammar full-matches (FN unless anchored), ignores lookarounds (FP) and a
    length bound beside it (FP). A length-bounded string takes no escape sequence on xgrammar
    (FN on ``"a\\nb"``); a bound above :data:`FREE_TEXT_MAX_LENGTH` marks free text, where
    newlines and quotes are to be expected. A pattern beside such a bound stays on xgrammar:
    it only drops a bound no output is likely to reach, while llguidance 1.9 builds a lexer for
    the pattern within the bound that overflows and rejects valid text without an error."""
    max_length = node.get("maxLength")
    free_text = isinstance(max_length, int | float) and max_length > FREE_TEXT_MAX_LENGTH
    pattern = node.get("pattern")
    if not isinstance(pattern, str) and free_text:
        return f"maxLength {max_length}: free text, whose escapes xgrammar rejects"
    if not isinstance(pattern, str):
        return None
    if not anchored(pattern):
        return f"pattern {pattern!r} is not anchored (^...$)"
    if any(look in pattern for look in _LOOKAROUND):
        return "pattern with a lookaround"
    if not free_text and any(k in node for k in ("minLength", "maxLength")):
        return "pattern beside minLength/maxLength"
    return None


def format_reason(node: Schema, root: Any) -> str | None:
    """Formats xgrammar checks differently from the standard (XGRAMMAR_INEXACT_FORMATS); and a
    string format without any ``type``, which xgrammar ignores (FP on a string that is not of
    the format; measured on Github_easy o32962, an untyped ``date-time``)."""
    fmt = node.get("format")
    if fmt in XGRAMMAR_INEXACT_FORMATS and admits(node, "string"):
        return f"format {fmt!r}"
    if "type" not in node and fmt in XGRAMMAR_STRING_FORMATS:
        return f"format {fmt!r} without a type"
    return None


def number_reason(node: Schema, root: Any) -> str | None:
    """multipleOf: xgrammar ignores it on anything but integers, and beside a bound (FP)."""
    if "multipleOf" not in node:
        return None
    if types_of(node, root) != frozenset({"integer"}) or not isinstance(node["multipleOf"], int):
        return "multipleOf on non-integers"
    if any(k in node for k in NUMBER_KEYWORDS if k != "multipleOf"):
        return "multipleOf beside a bound"
    return None


def value_reason(node: Schema, root: Any) -> str | None:
    """const/enum: xgrammar rejects object or array values when spaced (FN) and ignores a
    ``type`` beside them (FP on values of another type); uniqueItems: true is ignored (FP)."""
    values = [node["const"]] if "const" in node else node.get("enum")
    if isinstance(values, list) and any(isinstance(v, dict | list) for v in values):
        return "const/enum with object or array values"
    if isinstance(values, list) and "type" in node:
        declared = types_of({"type": node["type"]}, root)
        if declared is not None and any(json_type(v) not in declared for v in values):
            return "const/enum with values outside its type"
    if node.get("uniqueItems") is True:
        return "uniqueItems: true"
    return None


def keyword_reason(node: Schema, root: Any) -> str | None:
    ignored = sorted(k for k in node if k in XGRAMMAR_INEXACT_KEYWORDS)
    return f"{ignored[0]} (ignored by xgrammar)" if ignored else None


def admits(node: Schema, json_type_name: str) -> bool:
    declared = node.get("type")
    return declared == json_type_name or (isinstance(declared, list) and json_type_name in declared)


RULES: tuple[Callable[[Schema, Any], str | None], ...] = (
    keyword_reason,
    combinator_reason,
    ref_reason,
    object_reason,
    untyped_reason,
    string_reason,
    format_reason,
    number_reason,
    value_reason,
)


# --- The policy --------------------------------------------------------------------------------


def xgrammar_inexact_reason(schema_text: str) -> str | None:
    """Why xgrammar would not enforce this JSON schema exactly, or None if it would (after
    :func:`guidedec.grammar.schema_rewrite.rewrite_for_xgrammar`, which the backend applies)."""
    try:
        root = json.loads(rewrite_for_xgrammar(schema_text))
    except (json.JSONDecodeError, RecursionError):
        return None  # both backends reject it; xgrammar names the problem
    for node in reachable_schemas(root):
        for rule in RULES:
            reason = rule(node, root)
            if reason is not None:
                return reason
    return None


def xgrammar_is_exact(schema_text: str) -> bool:
    """Whether xgrammar enforces this JSON schema exactly (no construct it approximates)."""
    return xgrammar_inexact_reason(schema_text) is None


def name_trie_size(names: Iterable[str]) -> int:
    """Nodes of the trie of ``names``: the distinct non-empty prefixes."""
    return len({name[:end] for name in names for end in range(1, len(name) + 1)})


def xgrammar_costly_rules(root: Any) -> int:
    """How many costly rules xgrammar's grammar for this schema will have (within ~10).

    For an object open to additional properties, xgrammar matches "any name but the declared
    ones" with one rule per node of the trie of declared names, each a negated character class
    (``[^...]``) whose token mask spans the vocabulary; closed objects have none of them.
    """
    return sum(
        name_trie_size(node["properties"])
        for node in reachable_schemas(root)
        if isinstance(node.get("properties"), dict)
        and node.get("additionalProperties") is not False
    )


def xgrammar_too_costly(schema_text: str) -> str | None:
    """Why xgrammar's compile of this schema would take seconds, or None.

    Compile time follows the costly rules of :func:`xgrammar_costly_rules`, ~30 ms each on this
    project's 2-core CPU when idle (a Kubernetes schema with 500 of them: 11 s), two to three
    times that under load; the limit of :data:`XGRAMMAR_MAX_COSTLY_RULES` is ~4.5 s idle, where
    compiles under a loaded benchmark start to pass 10 s. llguidance builds its lexer lazily and
    compiles any of these in milliseconds.
    """
    try:
        rules = xgrammar_costly_rules(json.loads(rewrite_for_xgrammar(schema_text)))
    except (json.JSONDecodeError, RecursionError):
        return None
    if rules > XGRAMMAR_MAX_COSTLY_RULES:
        return f"~{rules} costly rules in xgrammar's grammar (slow to compile)"
    return None


def backend_order(params: GuidedDecodingParams, prefer: str = XGRAMMAR) -> tuple[str, str]:
    """The backends ``auto`` tries for ``params``, best first. ``prefer="llguidance"`` (what
    the engine, ``LLM``, asks) puts llguidance first for every JSON guide: its masks keep
    forced text in the tokenizer's own split of it, which is what jump-forward drafts propose,
    where xgrammar's allow any split and a model that takes another one rejects the rest of
    the draft (see ``docs/auto-backend.md``)."""
    if params.guide_type is GuideType.LARK:
        return (LLGUIDANCE, XGRAMMAR)
    if prefer == LLGUIDANCE and params.guide_type in (GuideType.JSON_SCHEMA, GuideType.JSON_OBJECT):
        return (LLGUIDANCE, XGRAMMAR)
    if params.guide_type is GuideType.JSON_SCHEMA:
        assert isinstance(params.guide, str)
        if not xgrammar_is_exact(params.guide) or xgrammar_too_costly(params.guide):
            return (LLGUIDANCE, XGRAMMAR)
    return (XGRAMMAR, LLGUIDANCE)
