"""Fault injection: a backend matcher that raises from one of its methods on its Nth call from
one call site, to prove that a backend failure anywhere on a host path fails its own request
and nothing else.

A :class:`FaultPlan` records every call the wrapped matchers receive by *site* (the function of
guidedec's own code that made it: ``"guidedec.decoder.rows:fill_request"``) and method, and
raises :class:`InjectedFaultError` at the call it targets. A test first runs a scenario with an
unarmed plan, which lists the sites that scenario reaches, then runs it again once per site, armed
at that site: a call site added later is covered without a change to the test.

:func:`inject` puts a :class:`FaultyFactory` in an engine (or anything holding a factory), so
that the matchers of the chosen guides, and only those, are faulty.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from guidedec.errors import MatcherError
from guidedec.grammar.matcher import (
    FILLED,
    GrammarMatcher,
    GrammarMatcherFactory,
    WrappedFactory,
    WrappedMatcher,
)
from guidedec.grammar.params import GuidedDecodingParams

FAULT_METHODS = (
    "accept_token",
    "advance",
    "advance_and_fill",
    "rollback",
    "fill_next_token_bitmask",
    "is_terminated",
    "completes",
    "forced_tokens",
)
"""The matcher methods a :class:`FaultyMatcher` can fail."""
_FILLS = ("advance_and_fill", "fill_next_token_bitmask")
FAULT_TEXT = "injected fault"
"""In the message of every :class:`InjectedFaultError`."""
_PASS_THROUGH = frozenset(
    {
        "guidedec.testing.faults",
        "guidedec.grammar.ruled",
        "guidedec.grammar.matcher",
        "guidedec.grammar.batch_fill",
    }
)
"""Modules whose frames are not call sites: they only hand a call on."""

Site = tuple[str, str]
"""(method, call site)."""


class InjectedFaultError(MatcherError):
    """What a :class:`FaultyMatcher` raises: a backend failure, as a backend reports one."""


@dataclass
class FaultPlan:
    """Which call fails, and every call seen.

    Attributes:
        method: The method whose call fails; None: none (a recording run).
        site: The call site whose call of ``method`` fails; None: any.
        nth: Which of the calls that ``method`` and ``site`` match fails, from 1.
        dead_end: The failing call, a fill, leaves its row allowing no token (a grammar state
            that allows nothing) instead of raising.
        calls: Calls seen so far, by ``(method, site)``.
        fired: The ``(method, site, nth)`` of the fault raised, once it has been.
    """

    method: str | None = None
    site: str | None = None
    nth: int = 1
    dead_end: bool = False
    calls: Counter[Site] = field(default_factory=Counter)
    fired: tuple[str, str, int] | None = None
    _matched: int = 0

    def arm(
        self,
        method: str | None = None,
        site: str | None = None,
        nth: int = 1,
        *,
        dead_end: bool = False,
    ) -> None:
        """Fail the ``nth`` call of ``method`` from ``site`` (any site: None) from now on; no
        call with no ``method`` (record only). The counts start again."""
        if method is not None and method not in FAULT_METHODS:
            raise ValueError(f"method must be one of {FAULT_METHODS}, got {method!r}")
        if dead_end and method not in _FILLS:
            raise ValueError(f"a dead end is made by a fill ({_FILLS}), not {method!r}")
        self.method, self.site, self.nth, self.dead_end = method, site, nth, dead_end
        self.calls.clear()
        self.fired, self._matched = None, 0

    def call(self, method: str) -> bool:
        """Count a call of ``method`` from the caller's site; raise if it is the target, or
        return True for a target fill that is to leave a dead end."""
        key = (method, call_site())
        self.calls[key] += 1
        if self.fired is not None or method != self.method:
            return False
        if self.site is None or key[1] == self.site:
            self._matched += 1
            if self._matched == self.nth:
                self.fired = (*key, self.nth)
                if self.dead_end:
                    return True
                raise InjectedFaultError(f"{FAULT_TEXT}: {method} #{self.nth} from {key[1]}")
        return False


def call_site() -> str:
    """``module:function`` of the innermost frame outside the matcher wrappers."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module not in _PASS_THROUGH:
            return f"{module}:{frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


class FaultyMatcher(WrappedMatcher):
    """``inner`` with every call counted by :class:`FaultPlan`, and failed where it says."""

    def __init__(self, inner: GrammarMatcher, plan: FaultPlan) -> None:
        super().__init__(inner)
        self.plan = plan
        self.unchecked_advance = inner.unchecked_advance

    def accept_token(self, token_id: int) -> bool:
        self.plan.call("accept_token")
        return self.inner.accept_token(token_id)

    def advance(self, token_id: int) -> bool:
        self.plan.call("advance")
        return self.inner.advance(token_id)

    def advance_and_fill(self, token_id: int, bitmask: torch.Tensor, index: int) -> int:
        dead_end = self.plan.call("advance_and_fill")
        status = self.inner.advance_and_fill(token_id, bitmask, index)
        if dead_end and status == FILLED:
            bitmask[index].zero_()
        return status

    def rollback(self, num_tokens: int) -> None:
        self.plan.call("rollback")
        self.inner.rollback(num_tokens)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        dead_end = self.plan.call("fill_next_token_bitmask")
        self.inner.fill_next_token_bitmask(bitmask, index)
        if dead_end:
            bitmask[index].zero_()

    def is_terminated(self) -> bool:
        self.plan.call("is_terminated")
        return self.inner.is_terminated()

    def completes(self, tokens: Sequence[int]) -> bool:
        self.plan.call("completes")
        return self.inner.completes(tokens)

    def forced_tokens(self) -> list[int]:
        self.plan.call("forced_tokens")
        return self.inner.forced_tokens()


class FaultyFactory(WrappedFactory):
    """Hands out :class:`FaultyMatcher` for the guides in ``guides``, plain matchers otherwise."""

    def __init__(
        self,
        inner: GrammarMatcherFactory,
        plan: FaultPlan,
        guides: Collection[GuidedDecodingParams],
    ) -> None:
        super().__init__(inner)
        self.plan, self.guides = plan, list(guides)

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        matcher = self.inner.create(params)
        return FaultyMatcher(matcher, self.plan) if params in self.guides else matcher


def inject(holder: Any, plan: FaultPlan, guides: Collection[GuidedDecodingParams]) -> None:
    """Make the matchers that ``holder`` creates for ``guides`` faulty: an engine (``LLM``: its
    decoder's factory, through which every matcher is made) or anything with a ``factory``."""
    target = getattr(holder, "decoder", holder)
    target.factory = FaultyFactory(target.factory, plan, guides)
