"""Timing the decoder's mask fills, for the mask-time limit and for pacing.

A build of fast masks pays nothing: fills are timed one by one only from a build slower than
:data:`FILL_TIMING_S` (or than the mask-time limit, if lower) until :data:`TIMING_HOLD` fast builds
in a row, so a slow request that sat out steps is still timed when it is back.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from guidedec.decoder.errors import SlowMasksError

if TYPE_CHECKING:
    import torch

    from guidedec.decoder.request import GuidedRequests
    from guidedec.decoder.slots import SlotState
    from guidedec.grammar.matcher import GrammarMatcher

FILL_TIMING_S = 4e-3
"""A build slower than this (or than the mask-time limit, if lower) has the builds after it time
each fill, for the mask-time limit and for :meth:`FillTiming.fill_times`."""
TIMING_HOLD = 64
"""Fast builds in a row after which fills are no longer timed (more than a paced request sits
out: see :mod:`guidedec.engine.pacing`)."""
SLOW_FILLS = 3
"""Fills in a row past ``mask_time_limit_ms`` (after a request's first) that fail it."""


class FillTiming:
    """Whether the current build times its fills, and each slot's fill seconds and slow fills
    (``slots.fill_s``, ``slots.slow_fills``).

    Args:
        slots: The decoder's per-slot state.
        mask_limit_s: The mask-time limit in seconds (``math.inf``: none).
    """

    def __init__(self, slots: SlotState, mask_limit_s: float) -> None:
        self.slots = slots
        self.mask_limit_s = mask_limit_s
        self._threshold_s = min(mask_limit_s, FILL_TIMING_S)  # a build slower than this is slow
        self.active = False  # the builds time their fills (after a slow build)
        self._fast_builds = 0  # builds in a row under the threshold while timing
        self._timed_batch: GuidedRequests | None = None  # the last build, if it timed fills

    def begin(self, batch: GuidedRequests) -> None:
        """Before a build: clear its requests' fill seconds when it times fills."""
        if self.active:
            fill_s = self.slots.fill_s
            for req in batch.requests:
                fill_s[req.seq_slot] = 0.0

    def end(self, batch: GuidedRequests, took: float) -> None:
        """After a build that took ``took`` seconds: start or stop timing the next builds."""
        timing = self.active
        self._timed_batch = batch if timing else None
        if took > self._threshold_s:
            self._fast_builds = 0
            if not timing:
                self._start(batch)
        elif timing:
            self._fast_builds += 1
            if self._fast_builds >= TIMING_HOLD:
                self.active = False
                slow = self.slots.slow_fills
                slow[:] = [min(count, 0) for count in slow]  # none in a row any more

    def _start(self, batch: GuidedRequests) -> None:
        """Time the next builds' fills one by one; the requests of this build have had a fill
        (their first is not held against them)."""
        self.active = True
        slow = self.slots.slow_fills
        for req in batch.requests:
            slow[req.seq_slot] = max(slow[req.seq_slot], 0)

    def fill(self, matcher: GrammarMatcher, bitmask: torch.Tensor, row: int, slot: int) -> None:
        """Fill one row, timed: a fill past the mask-time limit counts against its request (its
        first fill excepted: it may build what later ones reuse); :data:`SLOW_FILLS` in a row
        fail it (:class:`SlowMasksError`). One slow fill, a stall of the machine, does not."""
        began = perf_counter()
        matcher.fill_next_token_bitmask(bitmask, row)
        took = perf_counter() - began
        slots = self.slots
        slots.fill_s[slot] += took
        limit = self.mask_limit_s
        slow = slots.slow_fills[slot]
        if slow < 0 or took <= limit:
            slots.slow_fills[slot] = 0
            return
        slots.slow_fills[slot] = slow + 1
        if slow + 1 >= SLOW_FILLS:
            raise SlowMasksError(
                f"this guide's token masks take over {limit * 1e3:g} ms each ({took * 1e3:.0f} ms "
                f"the last, {SLOW_FILLS} in a row), past GuidedDecodingConfig.mask_time_limit_ms:"
                " it would slow every request of the batch"
            )

    def fill_times(self) -> dict[int, float]:
        """Seconds each request of the last build spent filling its rows, by request id, where
        that build timed its fills; requests filled untimed (a parallel wave) are left out, and
        so is every request of a build that was not timed."""
        batch = self._timed_batch
        if batch is None:
            return {}
        fill_s = self.slots.fill_s
        times = {req.request_id: fill_s[req.seq_slot] for req in batch.requests}
        return {request_id: took for request_id, took in times.items() if took > 0}
