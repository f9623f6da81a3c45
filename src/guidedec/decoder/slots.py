"""Per sequence slot: the grammar matcher of the request that holds it and its step counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from guidedec.grammar.matcher import GrammarMatcher


@dataclass(slots=True)
class SlotState:
    """What the decoder keeps per slot, one list per field indexed by slot (the hot loop reads
    and writes them in place).

    Attributes:
        matchers: The grammar matcher of the slot's request (None: no guided request).
        num_advanced_tokens: Matcher advances in the last build (the new token and the drafts
            fed), which the speculative rollbacks read.
        num_guided_tokens: Rows filled (and so masked) in the last build.
        num_advanced_draft_tokens: Advances during the current drafting loop.
        is_draft_terminated: Guiding of the current drafting loop has stopped for the slot.
        num_verifiable_tokens: The most tokens verification may accept (new token + drafts)
            after the last target build; fewer than ``1 + drafts`` where the grammar rejected a
            draft token.
        slow_fills: How many of the request's last mask fills in a row were past the mask-time
            limit; -1 before its first fill (which is not held against it).
        fill_s: Seconds the request's mask fills took in the last build, where that build
            timed them (see ``BaseGuidedDecoder.fill_times``).
    """

    matchers: list[GrammarMatcher | None]
    num_advanced_tokens: list[int]
    num_guided_tokens: list[int]
    num_advanced_draft_tokens: list[int]
    is_draft_terminated: list[bool]
    num_verifiable_tokens: list[int]
    slow_fills: list[int]
    fill_s: list[float]

    @classmethod
    def empty(cls, num_slots: int) -> SlotState:
        return cls(
            matchers=[None] * num_slots,
            num_advanced_tokens=[0] * num_slots,
            num_guided_tokens=[0] * num_slots,
            num_advanced_draft_tokens=[0] * num_slots,
            is_draft_terminated=[False] * num_slots,
            num_verifiable_tokens=[0] * num_slots,
            slow_fills=[0] * num_slots,
            fill_s=[0.0] * num_slots,
        )

    def reset(self, slot: int) -> None:
        """The slot holds no request any more (it finished, was aborted or failed): no matcher,
        and no advance left to roll back."""
        self.matchers[slot] = None
        self.num_advanced_tokens[slot] = self.num_guided_tokens[slot] = 0
        self.num_advanced_draft_tokens[slot] = self.num_verifiable_tokens[slot] = 0
        self.is_draft_terminated[slot] = False
        self.slow_fills[slot] = 0
        self.fill_s[slot] = 0.0

    def move(self, source: int, target: int, *, swap: bool) -> None:
        """The request at ``source`` now holds ``target``: the two slots trade their state
        (``swap``), or ``target`` takes ``source``'s and ``source`` holds no request."""
        fields: tuple[list[Any], ...] = (
            self.matchers,
            self.num_advanced_tokens,
            self.num_guided_tokens,
            self.num_advanced_draft_tokens,
            self.is_draft_terminated,
            self.num_verifiable_tokens,
            self.slow_fills,
            self.fill_s,
        )
        for values in fields:
            values[source], values[target] = values[target], values[source]
        if not swap:
            self.reset(source)

    def start(self, slot: int, matcher: GrammarMatcher) -> None:
        """A new request's matcher in the slot (its first fill is not held against it)."""
        self.reset(slot)
        self.slow_fills[slot] = -1
        self.matchers[slot] = matcher
