"""``backend="auto"``: per guide, the backend that enforces it exactly, with fallback.

The order comes from :func:`guidedec.grammar.auto_policy.backend_order` (measured on
JSONSchemaBench; see ``docs/auto-backend.md``):

* xgrammar first for every guide it enforces exactly, because its masks are faster; llguidance
  when xgrammar refuses the guide.
* llguidance first for Lark grammars (its own dialect), for JSON schemas that use a construct
  xgrammar only approximates (it would accept invalid output or reject valid output), because
  llguidance refuses what it cannot enforce, and for JSON schemas whose xgrammar compile would
  take seconds; xgrammar when llguidance refuses the guide.
* llguidance first for every JSON guide when ``GuidedDecodingConfig.auto_prefers`` says so
  (what the engine, ``LLM``, sets: its masks keep forced text in the tokenizer's own split,
  which jump-forward drafts).

The backend that compiled a guide is remembered, so later requests skip the policy.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from guidedec.errors import GrammarError
from guidedec.grammar.auto_policy import (
    LLGUIDANCE,
    XGRAMMAR,
    XGRAMMAR_INEXACT_KEYWORDS,
    backend_order,
    xgrammar_inexact_reason,
    xgrammar_is_exact,
    xgrammar_too_costly,
)
from guidedec.grammar.cache import guide_cache_key
from guidedec.grammar.config import CompileProbe, GuidedDecodingConfig
from guidedec.grammar.matcher import CompiledGuide, GrammarMatcher, GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams, GuideType

_MAX_REMEMBERED_CHOICES = 65536

__all__ = [
    "LLGUIDANCE",
    "XGRAMMAR",
    "XGRAMMAR_INEXACT_KEYWORDS",
    "AutoMatcherFactory",
    "backend_order",
    "build_backend_factory",
    "xgrammar_inexact_reason",
    "xgrammar_is_exact",
    "xgrammar_too_costly",
]


class AutoMatcherFactory(GrammarMatcherFactory):
    """Tries the backends in :func:`backend_order`, remembering which one compiled each guide.

    Backend factories are built on first use (building a backend's tokenizer takes ~1 s).
    """

    backend = "auto"

    def __init__(
        self, config: GuidedDecodingConfig, *, isolation: CompileProbe | None = None
    ) -> None:
        self.config, self.isolation = config, isolation
        self._factories: dict[str, GrammarMatcherFactory] = {}
        self._chosen: OrderedDict[Hashable, str] = OrderedDict()
        self._lock = threading.Lock()

    def factory(self, name: str) -> GrammarMatcherFactory:
        """The backend factory ``name`` (built once)."""
        with self._lock:
            if name not in self._factories:
                self._factories[name] = build_backend_factory(
                    name, self.config, isolation=self.isolation
                )
            return self._factories[name]

    def warm_up(self) -> None:
        for name in (XGRAMMAR, LLGUIDANCE):
            self.factory(name).warm_up()

    def forget(self, params: GuidedDecodingParams) -> None:
        with self._lock:
            built = list(self._factories.values())
        for factory in built:
            factory.forget(params)

    def chosen_backend(self, params: GuidedDecodingParams) -> str | None:
        """The backend that compiled ``params`` last time, if any."""
        with self._lock:
            return self._chosen.get(guide_cache_key(params))

    def compile(self, params: GuidedDecodingParams) -> CompiledGuide:
        return self._compile(params)[1]

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        backend = self._compile(params)[0]
        return backend.create(params)  # a cache hit: the backend has just compiled the guide

    def _compile(self, params: GuidedDecodingParams) -> tuple[GrammarMatcherFactory, CompiledGuide]:
        """The first backend of the order that compiles ``params``, and what it compiled."""
        key = guide_cache_key(params)
        known = self.chosen_backend(params)
        if not known:
            self.config.limits.check(params)  # before the policy reads the guide
        order = (known,) if known else backend_order(params, self.config.auto_prefers)
        errors: list[GrammarError] = []
        for name in order:
            inexact = self._refused_approximation(name, params, errors)
            if inexact is not None:
                errors.append(inexact)
                continue
            backend = self.factory(name)
            try:
                compiled = backend.compile(params)
            except GrammarError as exc:
                errors.append(exc)
                continue
            self._remember(key, name)
            return backend, compiled
        reasons = "; ".join(str(e) for e in errors)
        raise GrammarError(
            f"no backend can enforce this {params.guide_type.value} guide: {reasons}"
        )

    def _refused_approximation(
        self, name: str, params: GuidedDecodingParams, errors: list[GrammarError]
    ) -> GrammarError | None:
        """With ``approximate=False``: the refusal of a fallback to xgrammar for a JSON schema
        it only approximates (else None)."""
        if self.config.approximate or name != XGRAMMAR or not errors:
            return None
        if params.guide_type is not GuideType.JSON_SCHEMA:
            return None
        assert isinstance(params.guide, str)
        reason = xgrammar_inexact_reason(params.guide)
        if reason is None:
            return None
        return GrammarError(f"[xgrammar] would only approximate this schema ({reason})")

    def _remember(self, key: Hashable, name: str) -> None:
        with self._lock:
            self._chosen[key] = name
            self._chosen.move_to_end(key)
            if len(self._chosen) > _MAX_REMEMBERED_CHOICES:
                self._chosen.popitem(last=False)


def build_backend_factory(
    name: str, config: GuidedDecodingConfig, *, isolation: CompileProbe | None = None
) -> GrammarMatcherFactory:
    """The factory of backend ``name``, compiling new guides in ``isolation`` first (if any)."""
    if name == XGRAMMAR:
        from guidedec.grammar.xgrammar_backend import XGrammarMatcherFactory

        factory: GrammarMatcherFactory = XGrammarMatcherFactory(config)
    elif name == LLGUIDANCE:
        from guidedec.grammar.llguidance_backend import LLGuidanceMatcherFactory

        factory = LLGuidanceMatcherFactory(config)
    else:
        raise GrammarError(f"unknown guided decoding backend {name!r}")
    factory.isolation = isolation
    return factory
