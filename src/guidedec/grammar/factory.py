"""The one entry point that turns a :class:`GuidedDecodingConfig` into a matcher factory."""

from __future__ import annotations

from guidedec.grammar.auto import AutoMatcherFactory, build_backend_factory
from guidedec.grammar.config import CompileProbe, GuidedDecodingConfig
from guidedec.grammar.matcher import GrammarMatcherFactory


def create_grammar_matcher_factory(
    config: GuidedDecodingConfig, *, isolation: CompileProbe | None = None
) -> GrammarMatcherFactory:
    """The factory of ``config.backend``: ``"xgrammar"``, ``"llguidance"`` or ``"auto"``.

    ``isolation`` (a :class:`guidedec.grammar.isolation.CompileIsolation`) compiles each new
    guide first in a worker process, where a backend crash or hang fails that guide alone; the
    factory owns it (``factory.close()`` stops it). None (the default here; ``LLM`` and the
    server turn it on): in this process only.
    """
    if config.backend == "auto":
        return AutoMatcherFactory(config, isolation=isolation)
    return build_backend_factory(config.backend, config, isolation=isolation)
