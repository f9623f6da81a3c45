"""Imported once by the compile isolation's fork server, before it forks any worker: both
backends, so that every worker (and every replacement of a killed one) starts with them. An
engine on the default tokenizer preloads :mod:`guidedec.grammar.isolation_preload_default`
instead, which builds that tokenizer's views too."""

import guidedec.grammar.llguidance_backend
import guidedec.grammar.xgrammar_backend  # noqa: F401
