"""The fault-injection sweep of the engine tests: a scenario (engine options, a faulty request
among healthy ones) is run once to record every call its faulty request's matcher receives, by
method and call site, then once per recorded site and call (the first there, and the middle one),
with that call raising. Each time the faulty request must end ``grammar_error`` naming the fault,
and every healthy request exactly as it ends alone; afterwards the engine serves on.

The engine's time-driven choices (fills timed after a slow build, pacing, the closing search's
time limit, the step at which a compiled guide's request joins) are pinned, and what closing
keeps from one output for the next ones of a guide (witnesses) is dropped before each run, so
that every run of a scenario makes the same calls.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import guidedec.decoder.closing.settings
import guidedec.decoder.fill_timing
import guidedec.engine.pacing
from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.decoder.closing import BudgetCloser
from guidedec.testing.faults import FAULT_TEXT, FaultPlan, Site, inject

RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["id", "tags"],
}
HEALTHY = [
    (
        "Answer:",
        SamplingParams(
            max_tokens=16, guided_decoding=GuidedDecodingParams(regex="(yes|no)-[0-9]{1,4}")
        ),
    ),
    (
        "Name:",
        SamplingParams(
            max_tokens=40,
            guided_decoding=GuidedDecodingParams(
                json_schema={
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 12}},
                    "required": ["name"],
                }
            ),
        ),
    ),
]


@dataclass
class Scenario:
    """Engine options, the faulty request and the healthy ones beside it.

    Attributes:
        timed: Every build times its fills (else none does).
        reaches: Call sites the scenario must reach (what it is there to cover).
    """

    engine: dict[str, Any]
    faulty: tuple[str, SamplingParams]
    healthy: list[tuple[str, SamplingParams]]
    timed: bool = False
    reaches: frozenset[str] = field(default_factory=frozenset)


class _AtOnce(cf.Executor):
    """Runs each compile as it is submitted: a request joins at the step after it arrives."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


def pin_timing(monkeypatch: pytest.MonkeyPatch, timed: bool) -> None:
    monkeypatch.setattr(guidedec.decoder.fill_timing, "FILL_TIMING_S", 0.0 if timed else math.inf)
    monkeypatch.setattr(guidedec.engine.pacing, "pace", lambda *args: 0)
    monkeypatch.setattr(guidedec.decoder.closing.settings, "SLOW_SEARCH_S", math.inf)


def injection_points(calls: dict[Site, int]) -> list[tuple[Site, int]]:
    """Each recorded (method, site): its first call, and its middle one."""
    return [
        (site, nth) for site, count in sorted(calls.items()) for nth in sorted({1, -(-count // 2)})
    ]


def sweep(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> set[Site]:
    """Run the scenario's sweep (see the module docstring); returns the sites it covered."""
    pin_timing(monkeypatch, scenario.timed)
    llm = LLM(
        "tiny-random",
        dtype="float64",
        isolate_compiles=False,
        mask_time_limit_ms=None,
        # The faults find their request by its guide as written: the scenarios' schemas stay
        # open (closing objects would give the engine another guide, and shorter outputs).
        **{"disable_additional_properties": False, **scenario.engine},
    )
    llm.grammars._executor.shutdown()
    llm.grammars._executor = _AtOnce()  # compiles on the step loop: joins pinned
    prompt, faulty = scenario.faulty
    assert faulty.guided_decoding is not None
    plan = FaultPlan()
    inject(llm, plan, [faulty.guided_decoding])
    prompts = [prompt, *(p for p, _ in scenario.healthy)]
    params = [faulty, *(s for _, s in scenario.healthy)]

    def run() -> list[tuple[list[int], str, str | None]]:
        decoder = llm.decoder
        decoder.closer = BudgetCloser(
            llm.tokenizer, decoder.max_num_sequences, margin=decoder.closer.margin
        )
        return [_outcome(o) for o in llm.generate(prompts, params)]

    alone = [_outcome(llm.generate([p], [s])[0]) for p, s in scenario.healthy]
    plan.arm()
    baseline = run()
    assert baseline[1:] == alone
    assert baseline[0][1] in ("stop", "length") and baseline[0][2] is None, baseline[0]
    calls = dict(plan.calls)
    sites = set(calls)
    missing = scenario.reaches - {site for _, site in sites}
    assert not missing, f"the scenario did not reach {sorted(missing)}"
    for target, nth in injection_points(calls):
        plan.arm(*target, nth=nth)
        outcomes = run()
        assert plan.fired == (*target, nth), (target, nth, plan.fired)
        _, reason, error = outcomes[0]
        assert reason == "grammar_error" and error is not None and FAULT_TEXT in error, (
            target,
            nth,
            outcomes[0],
        )
        assert outcomes[1:] == alone, (target, nth)
        assert len(llm.scheduler.free_slots) == llm.decoder.max_num_sequences
        assert all(matcher is None for matcher in llm.decoder.grammar_matchers)
    plan.arm()
    assert run() == baseline  # the engine serves on, as before
    llm.close()
    return sites


def _outcome(output: Any) -> tuple[list[int], str, str | None]:
    return (output.token_ids, str(output.finish_reason), output.error)
