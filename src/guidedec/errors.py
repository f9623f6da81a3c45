"""Every exception guidedec raises on purpose.

Two tiers (as in llguidance): a token the grammar does not allow is an ordinary ``False`` from
``accept_token``; a guide that cannot be compiled, or a request that reaches a state it cannot
continue from, is an error of that request only. API misuse raises ``ValueError``.
"""

from __future__ import annotations


class GuidedecError(Exception):
    """Base class of guidedec's own exceptions."""


class GrammarError(GuidedecError, ValueError):
    """A guide could not be compiled or used: malformed schema, invalid regex, broken grammar,
    unknown backend, empty choice list, or a backend that refuses a feature.

    The message names the problem (and the backend, where one was involved).
    """

    def __init__(self, message: str, *, backend: str | None = None) -> None:
        self.backend = backend
        prefix = f"[{backend}] " if backend else ""
        super().__init__(prefix + message)


class UnsupportedGuideError(GrammarError):
    """A backend cannot enforce this guide (a feature it lacks); another backend may."""


class MatcherError(GuidedecError, RuntimeError):
    """A grammar matcher entered an unrecoverable state while a request was being decoded."""


REQUEST_ERRORS: tuple[type[Exception], ...] = (GuidedecError, ValueError, RuntimeError)
"""What a matcher operation may raise for one request; the decoder reports these for that
request only (anything else is a bug and propagates)."""
