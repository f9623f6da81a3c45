"""Documented backend limits: the only false positives, false negatives and invalid generated
outputs that the data-driven tests tolerate.

Keyed by ``(data set, case id, backend)``; each entry names the kinds of mismatch it covers and
the cause (the JSON Schema keyword or grammar feature, and the backend that gets it wrong).
``"fp"``: an invalid instance is accepted; ``"fn"``: a valid instance is rejected;
``"unsound"``: random-logits generation completed an invalid output. A backend with a documented
false positive on a guide may also generate invalid outputs for it, so ``"fp"`` covers
``"unsound"`` too. Two causes are recognised automatically and need no entry: instances whose
keys are not in the schema's ``properties`` order (both backends emit declared order) and
instances labelled invalid only because of a ``format``, which the JSON Schema spec treats as
an annotation. Measured with xgrammar 0.2.9 and llguidance 1.9.1 on the seeded samples of
``datasets.py``: a new sample needs a new measurement.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limit:
    kinds: frozenset[str]
    cause: str


JSTS = "JSON-Schema-Test-Suite"
HANDWRITTEN = "jsonschemabench/Handwritten"
SYNTHESIZED = "jsonschemabench/Synthesized"
GITHUB_TRIVIAL = "jsonschemabench/Github_trivial"
XGRAMMAR = ("xgrammar",)
LLGUIDANCE = ("llguidance",)
AUTO = ("auto",)
LLGUIDANCE_AND_AUTO = ("llguidance", "auto")

# What xgrammar 0.2.9 does not enforce (FP: accepts invalid output) or gets wrong (FN).
XGR_NOT = "xgrammar ignores `not` (FP)"
XGR_ONE_OF = "xgrammar enforces an overlapping `oneOf` as `anyOf` (FP)"
XGR_CONTAINS = "xgrammar ignores `contains`/`minContains`/`maxContains` (FP)"
XGR_UNIQUE = "xgrammar ignores `uniqueItems` (FP)"
XGR_UNEVALUATED = (
    "xgrammar approximates `unevaluatedProperties`: unevaluated properties pass beside "
    "`allOf`/`anyOf`/`$ref`/`dependentSchemas` (FP), properties an `anyOf` evaluates are "
    "rejected, and so are non-objects under `false` (FN)"
)
XGR_IF_THEN_ELSE = (
    "xgrammar ignores `if`/`then`/`else` and reads `unevaluatedItems: false` against the "
    "top-level `prefixItems` only (FN)"
)
XGR_DYNAMIC_REF = "xgrammar ignores `$dynamicRef` (FP)"
XGR_UNTYPED = "xgrammar ignores array/object keywords without a matching `type` (FP)"
XGR_ANY_OF_SIBLINGS = "xgrammar drops the keywords beside `anyOf` (here `type`) (FP)"
XGR_ALL_OF = (
    "xgrammar ignores an `allOf` of several branches and the keywords beside it (even `type`): "
    "any JSON value passes (FP)"
)
XGR_REQUIRED = "xgrammar ignores `required` names that `properties` does not list (FP)"
XGR_SPACED_CONST = (
    "xgrammar matches an object/array `const`/`enum` only as its compact text, so a spaced "
    "instance is rejected (FN)"
)
XGR_PATTERN_PROPERTIES = (
    "xgrammar full-matches `patternProperties` names (`^á` takes only `á`), so with "
    "`additionalProperties: false` a valid name is rejected (FN)"
)
XGR_PATTERN_FULL_MATCH = "xgrammar full-matches `pattern` (JSON Schema searches: `foo$`) (FN)"
XGR_ESCAPES = (
    "xgrammar matches `pattern` against the raw JSON text of a string, not the decoded "
    "`\\u` escape (FN)"
)
XGR_LONE_SURROGATE = "xgrammar's JSON strings accept a lone-surrogate escape `\\uD800` (FP)"
XGR_PREFIX_ITEMS_WHITESPACE = (
    "xgrammar's `prefixItems` array has two adjacent whitespace slots, so `[` 40 blanks `]` "
    "passes the 20-character bound (unsound)"
)
# llguidance 1.9.1.
LLG_FORMAT = "llguidance asserts `format` (email, ipv6, time) where the spec annotates (FN)"
LLG_LAZY_PANIC = (
    "llguidance panics (`!state.has_lowest_match()`) filling a mask of a lazy nullable lexeme "
    "(`r[lazy]: /[a-z]*/`), after which its verdicts on the grammar vary (FP, FN)"
)


def fallback(cause: str) -> str:
    """The cause of an ``auto`` mismatch where llguidance refused the guide."""
    return f"llguidance refuses the schema, so auto falls back to xgrammar: {cause}"


JSTS_NOT = ["not/1", "not/3", "not/4", "not/5", "not/8"]
JSTS_CONTAINS = ["maxContains/4", "minContains/4", "minContains/5"]
JSTS_DYNAMIC_REF = ["dynamicRef/3", "dynamicRef/4"]
JSTS_UNEVALUATED_FP = [f"unevaluatedProperties/{i}" for i in (31, 32, 33, 40, 42, 43)]
JSTS_UNEVALUATED_FN = ["unevaluatedProperties/11", "unevaluatedProperties/36"]
NOT_2 = "_subschema1_not_2.json"
SYNTHESIZED_ALL_OF = [
    f"draft2019_09_nonvalid_ref_id11{NOT_2}",
    f"draft2019_09_valid_oneOf_id21{NOT_2}",
]
SYNTHESIZED_ALL_OF_UNSOUND = [f"draft2019_09_valid_type_id70{NOT_2}"]
HANDWRITTEN_ALL_OF = ["object6.json", "mod302.json"]

# (data set, case ids, backends, kinds, cause)
Entry = tuple[str, Iterable[str], Iterable[str], str, str]
_ENTRIES: list[Entry] = [
    # --- xgrammar -------------------------------------------------------------------------
    (JSTS, JSTS_NOT, XGRAMMAR, "fp", XGR_NOT),
    (JSTS, ["oneOf/0"], XGRAMMAR, "fp", XGR_ONE_OF),
    (JSTS, JSTS_CONTAINS, XGRAMMAR, "fp", XGR_CONTAINS),
    (JSTS, ["uniqueItems/0"], XGRAMMAR, "fp", XGR_UNIQUE),
    (JSTS, JSTS_DYNAMIC_REF, XGRAMMAR, "fp", XGR_DYNAMIC_REF),
    (JSTS, JSTS_UNEVALUATED_FN, XGRAMMAR, "fn", XGR_UNEVALUATED),
    (JSTS, JSTS_UNEVALUATED_FP, XGRAMMAR, "fp", XGR_UNEVALUATED),
    (JSTS, ["unevaluatedItems/14"], XGRAMMAR, "fn", XGR_IF_THEN_ELSE),
    (JSTS, ["unevaluatedItems/14"], XGRAMMAR, "unsound", XGR_PREFIX_ITEMS_WHITESPACE),
    (JSTS, ["maxItems/0", "maxItems/1", "minItems/0", "minItems/1"], XGRAMMAR, "fp", XGR_UNTYPED),
    (JSTS, ["patternProperties/0", "patternProperties/1"], XGRAMMAR, "fp", XGR_UNTYPED),
    (JSTS, ["anyOf/1"], XGRAMMAR, "fp", XGR_ANY_OF_SIBLINGS),
    (JSTS, ["items/3", "required/3"], XGRAMMAR, "fp", XGR_REQUIRED),
    (JSTS, ["const/9"], XGRAMMAR, "fn", XGR_SPACED_CONST),
    (JSTS, ["additionalProperties/1"], XGRAMMAR, "fn", XGR_PATTERN_PROPERTIES),
    (GITHUB_TRIVIAL, ["o42159.json"], XGRAMMAR, "fp", XGR_ONE_OF),
    (HANDWRITTEN, ["notnames10.json"], XGRAMMAR, "fn", XGR_SPACED_CONST),
    (HANDWRITTEN, ["oneof13.json"], XGRAMMAR, "unsound", XGR_NOT),
    (SYNTHESIZED, SYNTHESIZED_ALL_OF, XGRAMMAR, "fp", XGR_ALL_OF),
    (SYNTHESIZED, SYNTHESIZED_ALL_OF_UNSOUND, XGRAMMAR, "unsound", XGR_ALL_OF),
    (HANDWRITTEN, HANDWRITTEN_ALL_OF, XGRAMMAR, "unsound", XGR_ALL_OF),
    (
        "llguidance-lark",
        ["test_json_general_unicode_escapes_in_unconstrained_values:795"],
        XGRAMMAR,
        "fp",
        XGR_LONE_SURROGATE,
    ),
    (
        "llguidance-lark",
        ["test_json_general_unicode_escapes_do_not_change_regex_constraints:861"],
        XGRAMMAR,
        "fn",
        XGR_ESCAPES,
    ),
    ("llguidance-lark", ["test_json_anchoring:898"], XGRAMMAR, "fn", XGR_PATTERN_FULL_MATCH),
    # --- llguidance -----------------------------------------------------------------------
    # auto too: it sends a string format without a type to llguidance, because real schemas
    # mean it as an assertion (JSONSchemaBench labels such instances invalid, Github_easy o32962).
    (JSTS, ["format/0", "format/4", "format/9"], LLGUIDANCE_AND_AUTO, "fn", LLG_FORMAT),
    (
        "xgrammar-lark",
        ["test_lark_lazy_nullable_always_matches_empty#0:2109"],
        LLGUIDANCE_AND_AUTO,  # auto tries llguidance first for Lark
        "fp fn",
        LLG_LAZY_PANIC,
    ),
    # --- auto: llguidance refuses the guide ("Unimplemented keys", "oneOf constraints are not
    # supported", overlapping patternProperties, "Expected positive integer" for 2.0) ----------
    (JSTS, JSTS_NOT, AUTO, "fp", fallback(XGR_NOT)),
    (JSTS, ["oneOf/0"], AUTO, "fp", fallback(XGR_ONE_OF)),
    (JSTS, JSTS_CONTAINS, AUTO, "fp", fallback(XGR_CONTAINS)),
    (JSTS, ["uniqueItems/0"], AUTO, "fp", fallback(XGR_UNIQUE)),
    (JSTS, JSTS_DYNAMIC_REF, AUTO, "fp", fallback(XGR_DYNAMIC_REF)),
    (JSTS, JSTS_UNEVALUATED_FN, AUTO, "fn", fallback(XGR_UNEVALUATED)),
    (JSTS, JSTS_UNEVALUATED_FP, AUTO, "fp", fallback(XGR_UNEVALUATED)),
    (JSTS, ["unevaluatedItems/14"], AUTO, "fn", fallback(XGR_IF_THEN_ELSE)),
    (JSTS, ["maxItems/1", "minItems/1", "patternProperties/1"], AUTO, "fp", fallback(XGR_UNTYPED)),
    (GITHUB_TRIVIAL, ["o42159.json"], AUTO, "fp", fallback(XGR_ONE_OF)),
    (HANDWRITTEN, ["notnames10.json"], AUTO, "fn", fallback(XGR_SPACED_CONST)),
    (HANDWRITTEN, ["oneof13.json"], AUTO, "unsound", fallback(XGR_NOT)),
    (SYNTHESIZED, SYNTHESIZED_ALL_OF, AUTO, "fp", fallback(XGR_ALL_OF)),
    (SYNTHESIZED, SYNTHESIZED_ALL_OF_UNSOUND, AUTO, "unsound", fallback(XGR_ALL_OF)),
    (HANDWRITTEN, HANDWRITTEN_ALL_OF, AUTO, "unsound", fallback(XGR_ALL_OF)),
]


def _build(entries: list[Entry]) -> dict[tuple[str, str, str], Limit]:
    limits: dict[tuple[str, str, str], Limit] = {}
    for dataset, case_ids, backends, kinds, cause in entries:
        for case_id in case_ids:
            for backend in backends:
                key = (dataset, case_id, backend)
                old = limits.get(key, Limit(frozenset(), ""))
                causes = f"{old.cause}; {cause}" if old.cause else cause
                limits[key] = Limit(old.kinds | frozenset(kinds.split()), causes)
    return limits


KNOWN_LIMITS: dict[tuple[str, str, str], Limit] = _build(_ENTRIES)


def allowed(dataset: str, case_id: str, backend: str, kind: str) -> Limit | None:
    """The documented limit covering this mismatch, if any."""
    entry = KNOWN_LIMITS.get((dataset, case_id, backend))
    if entry is None:
        return None
    covers = entry.kinds | ({"unsound"} if "fp" in entry.kinds else set())
    return entry if kind in covers else None


def documented_mismatches(dataset: str, backend: str, kinds: set[str]) -> list[str]:
    """The case ids of ``dataset`` with a documented limit of one of ``kinds`` on ``backend``."""
    return [
        case_id
        for (name, case_id, limited), entry in KNOWN_LIMITS.items()
        if (name, limited) == (dataset, backend) and entry.kinds & kinds
    ]
