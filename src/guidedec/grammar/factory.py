"""The one entry point that turns a :class:`GuidedDecodingConfig` into a matcher factory."""

from __future__ import annotations

from guidedec.grammar.auto import AutoMatcherFactory, build_backend_factory
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.matcher import GrammarMatcherFactory


def create_grammar_matcher_factory(config: GuidedDecodingConfig) -> GrammarMatcherFactory:
    """The factory of ``config.backend``: ``"xgrammar"``, ``"llguidance"`` or ``"auto"``."""
    if config.backend == "auto":
        return AutoMatcherFactory(config)
    return build_backend_factory(config.backend, config)
