"""Pacing: a request whose masks are slow sits out steps instead of setting everyone's pace."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.engine.pacing import MAX_SIT_OUT, PACE_SHARE, pace
from guidedec.engine.request import Request
from guidedec.engine.scheduler import Scheduled, Scheduler
from guidedec.grammar.matcher import GrammarMatcher, WrappedFactory
from guidedec.testing import SlowMasks

pytestmark = pytest.mark.timed_search  # slow masks: searches give up as in production

SLOW = GuidedDecodingParams(regex="[xy]{200}")  # no end within the budget: 24 tokens each
HEALTHY = GuidedDecodingParams(regex="[ab]{200}")
SLOW_FILL_S = 0.012  # under the 20 ms mask-time limit: paced, never failed


def _generating(request_id: int) -> Request:
    req = Request(request_id, None, [1, 2, 3], SamplingParams(max_tokens=8), None)
    req.num_computed, req.output_token_ids = 3, [4]
    return req


def _scheduler(*requests: Request) -> Scheduler:
    scheduler = Scheduler(max_num_seqs=4, max_num_tokens=64)
    for req in requests:
        scheduler.add(req)
    return scheduler


def _ids(batch: list[Scheduled]) -> list[int]:
    return [s.request.request_id for s in batch]


def test_a_request_sits_out_its_steps_while_others_run() -> None:
    slow, other = _generating(0), _generating(1)
    scheduler = _scheduler(slow, other)
    slow.sit_out = 2
    assert _ids(scheduler.schedule()) == [1] and scheduler.num_sat_out == 1
    assert _ids(scheduler.schedule()) == [1] and slow.sit_out == 0
    assert _ids(scheduler.schedule()) == [0, 1] and scheduler.num_sat_out == 0


def test_a_request_never_waits_when_nothing_else_would_run() -> None:
    slow, other = _generating(0), _generating(1)
    scheduler = _scheduler(slow, other)
    scheduler.schedule()
    slow.sit_out = other.sit_out = 3
    assert _ids(scheduler.schedule()) == [0, 1]
    assert slow.sit_out == other.sit_out == 0 and scheduler.num_sat_out == 0
    alone = _generating(2)
    lonely = _scheduler(alone)
    lonely.schedule()
    alone.sit_out = 5
    assert _ids(lonely.schedule()) == [2] and alone.sit_out == 0


def test_a_waiting_request_does_not_hold_back_a_prefill() -> None:
    slow = _generating(0)
    prefill = Request(1, None, [5, 6, 7], SamplingParams(max_tokens=8), None)
    scheduler = _scheduler(slow, prefill)
    slow.sit_out = 1
    batch = scheduler.schedule()
    assert _ids(batch) == [1] and batch[0].is_prefill


@pytest.mark.parametrize(
    ("fill_s", "expected"),
    [
        (0.0005, 0),  # within the share of a 10 ms step
        (0.010, math.ceil(0.010 / (PACE_SHARE * 0.010)) - 1),
        (0.012, math.ceil(0.012 / (PACE_SHARE * 0.010)) - 1),
        (10.0, MAX_SIT_OUT),
    ],
)
def test_the_sit_out_brings_the_average_cost_back_to_the_share(
    fill_s: float, expected: int
) -> None:
    slow, other = _generating(0), _generating(1)
    batch = [Scheduled(slow, [4], is_prefill=False), Scheduled(other, [4], is_prefill=False)]
    assert pace(batch, {0: fill_s, 1: 0.0001}, 0.010) == (expected > 0)
    assert slow.sit_out == expected and other.sit_out == 0
    if 0 < expected < MAX_SIT_OUT:  # one step in 1 + sit_out costs the fill: within the share
        assert fill_s / (1 + expected) <= PACE_SHARE * 0.010 < fill_s / expected


def test_a_request_alone_is_never_paced() -> None:
    slow = _generating(0)
    assert pace([Scheduled(slow, [4], is_prefill=False)], {0: 1.0}, 0.001) == 0
    assert slow.sit_out == 0


class _SlowGuideFactory(WrappedFactory):
    """The matchers of ``SLOW`` fill their masks slowly; the others are the backend's own."""

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        matcher = self.inner.create(params)
        return SlowMasks(matcher, SLOW_FILL_S) if params == SLOW else matcher


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    engine = LLM("tiny-random", max_num_seqs=2)
    engine.decoder.factory = _SlowGuideFactory(engine.decoder.factory)
    yield engine
    engine.close()


def _params(guide: GuidedDecodingParams, seed: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=24,
        temperature=1.0,
        seed=seed,
        guided_decoding=guide,
        close_within_budget=False,
    )


def test_slow_masks_sit_out_steps_and_change_no_output(llm: LLM) -> None:
    healthy_alone = llm.generate(["A:"], [_params(HEALTHY, 1)])[0]
    slow_alone = llm.generate(["B:"], [_params(SLOW, 2)])[0]
    paced, sat_out = llm.stats.paced_requests, llm.stats.steps_sat_out
    assert paced == sat_out == 0  # alone: nothing to protect
    slow, healthy = llm.generate(["B:", "A:"], [_params(SLOW, 2), _params(HEALTHY, 1)])
    assert healthy.token_ids == healthy_alone.token_ids
    assert slow.token_ids == slow_alone.token_ids
    assert len(slow.token_ids) == len(healthy.token_ids) == 24
    assert llm.stats.paced_requests > 0 and llm.stats.steps_sat_out > 0
    # Side by side, every step would serve both: the healthy request finishes first only
    # because the slow one sat out steps.
    assert healthy.metrics.finished is not None and slow.metrics.finished is not None
    assert healthy.metrics.finished < slow.metrics.finished
