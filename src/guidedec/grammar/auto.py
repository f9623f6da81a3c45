"""``backend="auto"``: per guide, the backend that enforces it exactly, with fallback.

Policy (measured on JSONSchemaBench; see ``docs/auto-backend.md``):

* xgrammar first for every guide it enforces exactly, because its masks are several times
  faster; llguidance when xgrammar refuses the guide.
* llguidance first for Lark grammars (its own dialect) and for JSON schemas that use a feature
  xgrammar only approximates (it would accept invalid output or reject valid output), because
  llguidance refuses what it cannot enforce; xgrammar when llguidance refuses the guide.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any

from guidedec.errors import GrammarError
from guidedec.grammar.cache import guide_cache_key
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.matcher import GrammarMatcher, GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams, GuideType

XGRAMMAR = "xgrammar"
LLGUIDANCE = "llguidance"
_MAX_REMEMBERED_CHOICES = 65536

# JSON Schema keywords that xgrammar 0.2 accepts but does not enforce exactly.
XGRAMMAR_INEXACT_KEYWORDS = frozenset(
    {
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "multipleOf",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "format",
    }
)
# String constraints that xgrammar cannot combine with a ``pattern``.
_LENGTH_KEYWORDS = ("minLength", "maxLength")


def schema_keywords(schema: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``(keyword, enclosing schema object)`` of a JSON schema, data values excluded."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                yield key, node
                if key in ("const", "enum", "default", "examples"):
                    continue
                if key in ("properties", "patternProperties", "$defs", "definitions"):
                    if isinstance(value, dict):
                        stack.extend(value.values())
                    continue
                stack.append(value)


def xgrammar_is_exact(schema_text: str) -> bool:
    """Whether xgrammar enforces this JSON schema exactly (no keyword it only approximates)."""
    try:
        schema = json.loads(schema_text)
    except (json.JSONDecodeError, RecursionError):
        return True  # both backends will reject it; xgrammar names the problem
    for key, node in schema_keywords(schema):
        if key in XGRAMMAR_INEXACT_KEYWORDS:
            return False
        if key == "pattern" and any(k in node for k in _LENGTH_KEYWORDS):
            return False
    return True


def backend_order(params: GuidedDecodingParams) -> tuple[str, str]:
    """The backends ``auto`` tries for ``params``, best first."""
    if params.guide_type is GuideType.LARK:
        return (LLGUIDANCE, XGRAMMAR)
    if params.guide_type is GuideType.JSON_SCHEMA:
        assert isinstance(params.guide, str)
        if not xgrammar_is_exact(params.guide):
            return (LLGUIDANCE, XGRAMMAR)
    return (XGRAMMAR, LLGUIDANCE)


class AutoMatcherFactory(GrammarMatcherFactory):
    """Tries the backends in :func:`backend_order`, remembering which one compiled each guide.

    Backend factories are built on first use (building a backend's tokenizer takes ~1 s).
    """

    backend = "auto"

    def __init__(self, config: GuidedDecodingConfig) -> None:
        self.config = config
        self._factories: dict[str, GrammarMatcherFactory] = {}
        self._chosen: OrderedDict[Hashable, str] = OrderedDict()
        self._lock = threading.Lock()

    def factory(self, name: str) -> GrammarMatcherFactory:
        """The backend factory ``name`` (built once)."""
        with self._lock:
            if name not in self._factories:
                self._factories[name] = build_backend_factory(name, self.config)
            return self._factories[name]

    def chosen_backend(self, params: GuidedDecodingParams) -> str | None:
        """The backend that compiled ``params`` last time, if any."""
        with self._lock:
            return self._chosen.get(guide_cache_key(params))

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        key = guide_cache_key(params)
        known = self.chosen_backend(params)
        order = (known,) if known else backend_order(params)
        errors: list[GrammarError] = []
        for name in order:
            try:
                matcher = self.factory(name).create(params)
            except GrammarError as exc:
                errors.append(exc)
                continue
            self._remember(key, name)
            return matcher
        reasons = "; ".join(str(e) for e in errors)
        raise GrammarError(
            f"no backend can enforce this {params.guide_type.value} guide: {reasons}"
        )

    def _remember(self, key: Hashable, name: str) -> None:
        with self._lock:
            self._chosen[key] = name
            self._chosen.move_to_end(key)
            if len(self._chosen) > _MAX_REMEMBERED_CHOICES:
                self._chosen.popitem(last=False)


def build_backend_factory(name: str, config: GuidedDecodingConfig) -> GrammarMatcherFactory:
    if name == XGRAMMAR:
        from guidedec.grammar.xgrammar_backend import XGrammarMatcherFactory

        return XGrammarMatcherFactory(config)
    if name == LLGUIDANCE:
        from guidedec.grammar.llguidance_backend import LLGuidanceMatcherFactory

        return LLGuidanceMatcherFactory(config)
    raise GrammarError(f"unknown guided decoding backend {name!r}")
