"""Filling the rows of a whole batch: one call per backend, in parallel where that pays.

Both backends can fill many matchers' rows in one call on their own threads (xgrammar's
``BatchGrammarMatcher``, llguidance's ``LLExecutor``). Whether that beats a plain loop depends on
the machine (its cores, and what else runs on them: the model's forward pass, in an engine that
builds masks while it runs), on the backend and on the batch, so ``BatchFiller`` does not
assume: in ``"auto"`` mode it times both ways on the same live batches, per backend and
batch-size bucket, keeps the faster and measures again now and then. The masks are the same
either way; only the time differs.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import get_args

import torch

from guidedec.errors import REQUEST_ERRORS
from guidedec.grammar.config import FillMode
from guidedec.grammar.matcher import GrammarMatcher, fill_one_by_one
from guidedec.grammar.ruled import RuledMatcher, batch_member

FILL_MODES: tuple[str, ...] = get_args(FillMode)

MIN_PARALLEL_ROWS = 4
"""Fewer rows of one backend are always filled one by one: a parallel call then costs more than
it saves (measured by ``guidedec bench fill``)."""
PROBES = 12
"""Calls of a bucket that ``"auto"`` fills both ways, timed, before it picks one (even: half
start with each way)."""
FIRST_REPROBE = 100
"""Calls of a bucket after its first choice when ``"auto"`` measures again: the first choice
is made on a grammar's first states, which can cost more than later ones (lazily built lexer
states parallelise well; warm ones are cheap enough for the thread hand-off to dominate)."""
REPROBE_EVERY = 1000
"""Calls of a bucket between later measurements (the load may change)."""

Errors = list[Exception | None]


def default_fill_threads() -> int:
    """The CPUs this process may run on, at most 16."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 16))


@dataclass(slots=True)
class _Bucket:
    """The measurements of one (backend, batch-size bucket).

    While measuring, a call fills its rows both ways, in alternating order (the second way
    rewrites the same rows with the same bits), and records parallel time / sequential time:
    paired on the same grammar states, because the cost of a row varies far more between states
    than between the two ways. The way that runs first also pays for what the backend builds
    lazily on first use of a state (llguidance's lexer states, for one), which the second way
    then finds ready: a factor that multiplies the ratio in one order and divides it in the
    other. The geometric mean over an even number of calls, half in each order, cancels it.
    """

    ratios: list[float] = field(default_factory=list)
    choice: bool | None = None  # True: parallel; None: still measuring
    calls: int = 0
    horizon: int = field(default_factory=lambda: FIRST_REPROBE)  # calls to the next measuring

    def measuring(self) -> bool:
        if self.choice is not None:
            self.calls += 1
            if self.calls < self.horizon:
                return False
            self.ratios.clear()
            self.choice, self.calls, self.horizon = None, 0, REPROBE_EVERY
        return True

    def record(self, parallel_s: float, sequential_s: float) -> None:
        self.ratios.append(max(parallel_s, 1e-9) / max(sequential_s, 1e-9))
        if len(self.ratios) >= PROBES:
            self.choice = statistics.fmean(math.log(r) for r in self.ratios) < 0.0


class BatchFiller:
    """Fills bitmask rows for many matchers (of any backends) at once.

    Args:
        mode: ``"auto"`` (default) measures which way is faster, per backend and batch-size
            bucket (powers of two), on the first calls of each (see :class:`_Bucket`);
            ``"parallel"`` always uses the backend's batch call (from ``MIN_PARALLEL_ROWS``
            rows); ``"sequential"`` fills one row at a time.
        num_threads: Threads of a parallel fill (default: :func:`default_fill_threads`); with
            fewer than 2, every fill is sequential.
        clock: The timer of ``"auto"`` (tests pass a fake one).
    """

    def __init__(
        self,
        mode: FillMode = "auto",
        num_threads: int | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if mode not in FILL_MODES:
            raise ValueError(f"fill mode must be one of {list(FILL_MODES)}, got {mode!r}")
        threads = default_fill_threads() if num_threads is None else num_threads
        if threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.mode: FillMode = mode if threads > 1 else "sequential"
        self.num_threads = threads
        self.min_parallel_rows = sys.maxsize if self.mode == "sequential" else MIN_PARALLEL_ROWS
        """Batches of fewer rows are filled one at a time, whatever was measured."""
        self._clock = clock
        self._buckets: dict[tuple[type[GrammarMatcher], int], _Bucket] = {}

    def fill(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> Errors:
        """Fill row ``rows[i]`` for ``matchers[i]`` (none terminated).

        Returns, per matcher, the exception its fill raised or None, as
        :meth:`GrammarMatcher.fill_next_token_bitmasks`. A matcher under row rules
        (:class:`~guidedec.grammar.ruled.RuledMatcher`) is filled in its backend's batch call,
        then its rules restrict its row.
        """
        if self.one_by_one(len(matchers)):
            return fill_one_by_one(matchers, bitmask, rows)
        members = [batch_member(matcher) for matcher in matchers]
        groups: dict[type[GrammarMatcher], list[int]] = {}
        for i, member in enumerate(members):
            groups.setdefault(type(member), []).append(i)
        if len(groups) == 1:
            ((cls, _),) = groups.items()
            errors = self._fill_group(cls, members, bitmask, rows)
        else:
            errors = [None] * len(matchers)
            for cls, indices in groups.items():
                group = [members[i] for i in indices]
                group_rows = [rows[i] for i in indices]
                group_errors = self._fill_group(cls, group, bitmask, group_rows)
                for i, error in zip(indices, group_errors, strict=True):
                    errors[i] = error
        for i, matcher in enumerate(matchers):
            if errors[i] is None and isinstance(matcher, RuledMatcher):
                try:
                    matcher.restrict_row(bitmask, rows[i])
                except REQUEST_ERRORS as exc:
                    errors[i] = exc
        return errors

    def one_by_one(self, num_rows: int) -> bool:
        """Whether :meth:`fill` of ``num_rows`` rows surely fills them one at a time (callers
        then skip building its argument lists)."""
        return num_rows < self.min_parallel_rows

    def decisions(self) -> dict[tuple[str, int], str]:
        """What ``"auto"`` has settled on so far: ``(backend, smallest batch of the bucket)`` ->
        ``"parallel"``, ``"sequential"`` or ``"measuring"``."""
        names = {None: "measuring", True: "parallel", False: "sequential"}
        return {
            (getattr(cls, "backend", "") or cls.__name__, 1 << (bucket - 1)): names[state.choice]
            for (cls, bucket), state in sorted(
                self._buckets.items(), key=lambda item: (item[0][0].__name__, item[0][1])
            )
        }

    def _fill_group(
        self,
        cls: type[GrammarMatcher],
        matchers: Sequence[GrammarMatcher],
        bitmask: torch.Tensor,
        rows: Sequence[int],
    ) -> Errors:
        if not cls.parallel_fill or len(matchers) < MIN_PARALLEL_ROWS:
            return fill_one_by_one(matchers, bitmask, rows)
        if self.mode == "parallel":
            return self._parallel(cls, matchers, bitmask, rows)
        key = (cls, len(matchers).bit_length())
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
        if not bucket.measuring():
            if bucket.choice:
                return self._parallel(cls, matchers, bitmask, rows)
            return fill_one_by_one(matchers, bitmask, rows)
        parallel_first = len(bucket.ratios) % 2 == 0
        times = {}
        for parallel in (parallel_first, not parallel_first):
            start = self._clock()
            if parallel:
                self._parallel(cls, matchers, bitmask, rows)
            else:
                errors = fill_one_by_one(matchers, bitmask, rows)
            times[parallel] = self._clock() - start
        bucket.record(times[True], times[False])
        return errors

    def _parallel(
        self,
        cls: type[GrammarMatcher],
        matchers: Sequence[GrammarMatcher],
        bitmask: torch.Tensor,
        rows: Sequence[int],
    ) -> Errors:
        """The backend's batch call; where it raises for the whole batch, the rows one by one,
        so that a failure is reported for its own matcher only."""
        try:
            return cls.fill_next_token_bitmasks(
                matchers, bitmask, rows, num_threads=self.num_threads
            )
        except REQUEST_ERRORS:
            return fill_one_by_one(matchers, bitmask, rows)
