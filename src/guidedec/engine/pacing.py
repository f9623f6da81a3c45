"""Pacing: a request whose token masks are slow sits out steps, so that it does not set the pace
of every request batched with it.

A step waits for its slowest mask. A guide whose masks take 12 ms (llguidance's lexer on a nested
Lark repetition) beside requests whose step takes 3 ms would make them all four times slower,
while staying under the mask-time limit that fails a guide. So after a step, each request whose
mask fills took more than :data:`PACE_SHARE` of the engine's usual step (the median of its recent
steps' own work, the forward and the sampling: a slow build beside a forward slows that forward
too) is left out of as many of the following steps as bring its average cost per step back to that
share (``ceil(fill / (PACE_SHARE * step)) - 1``, at most :data:`MAX_SIT_OUT`). The others keep
their pace, at most ``1 + PACE_SHARE`` of it; the slow request generates the same tokens, later
(sampling draws from the request's own generator, which a step it sits out does not touch).

Fill times come from the decoder's timed builds (:meth:`guidedec.decoder.GuidedDecoder.fill_times`:
from a build slower than 4 ms on, and only where rows are filled one at a time), so a batch
of fast masks is never paced. A request alone, or whose batch holds nothing else to serve, never
waits (:class:`guidedec.engine.scheduler.Scheduler`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence

from guidedec.engine.scheduler import Scheduled

PACE_SHARE = 0.25
"""The share of a step's own work (forward and sampling) that one request's masks may add to it,
on average over the steps it runs in and those it sits out."""
MAX_SIT_OUT = 32
"""The most steps a request sits out after one slow step."""
PACE_WINDOW = 32
"""Steps whose own work makes the engine's usual step (their median)."""


class Pacer:
    """Paces the engine's requests after each step against its usual step (the median of its
    last :data:`PACE_WINDOW` steps' own work)."""

    def __init__(self) -> None:
        self._work: deque[float] = deque(maxlen=PACE_WINDOW)  # forward + sampling, s

    def after_step(
        self, batch: Sequence[Scheduled], fill_times: Mapping[int, float], work_s: float
    ) -> int:
        """Note a step's own work (``work_s``) and pace its requests by their ``fill_times``;
        returns how many sit out steps."""
        self._work.append(work_s)
        if not fill_times:
            return 0
        return pace(batch, fill_times, statistics.median(self._work))


def pace(batch: Sequence[Scheduled], fill_times: Mapping[int, float], step_s: float) -> int:
    """Set ``sit_out`` on the requests of ``batch`` whose fills (``fill_times``, seconds by
    request id) took more than :data:`PACE_SHARE` of ``step_s``; returns how many."""
    if len(batch) < 2 or not fill_times or step_s <= 0:
        return 0
    allowed = PACE_SHARE * step_s
    paced = 0
    for s in batch:
        took = fill_times.get(s.request.request_id, 0.0)
        if took > allowed:
            s.request.sit_out = min(MAX_SIT_OUT, math.ceil(took / allowed) - 1)
            paced += s.request.sit_out > 0
    return paced
