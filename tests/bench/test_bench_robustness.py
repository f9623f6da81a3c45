"""``guidedec bench robustness``: what it reports of each category, on a stand-in engine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from guidedec import GuidedDecodingParams
from guidedec.bench import robustness


class TimedEngine:
    """Answers ``generate`` with outputs whose engine times (arrival to end) are given in turn."""

    def __init__(self, healthy_times: list[float], tokens: list[list[int]]) -> None:
        self.healthy_times, self.tokens = healthy_times, tokens

    def generate(self, prompts: list[str], params: list[Any]) -> list[SimpleNamespace]:
        outputs = []
        for prompt in prompts:
            if prompt == "Oops:":
                outputs.append(output(2.0, [7], "length"))
            else:
                outputs.append(output(self.healthy_times.pop(0), self.tokens.pop(0), "stop"))
        return outputs


def output(seconds: float, tokens: list[int], reason: str) -> SimpleNamespace:
    metrics = SimpleNamespace(arrival=100.0, finished=100.0 + seconds)
    return SimpleNamespace(metrics=metrics, token_ids=tokens, finish_reason=reason, error=None)


def test_the_baseline_is_the_median_of_the_runs_alone_and_every_output_must_agree() -> None:
    guides = {"a": GuidedDecodingParams(regex="a"), "b": GuidedDecodingParams(regex="b")}
    # per category: three runs alone, then the run beside the hostile request
    times = [1.0, 3.0, 2.0, 3.0, 0.5, 0.5, 9.0, 0.5]
    same, other = [1, 2], [1, 3]
    tokens = [same, same, same, same, same, other, same, same]
    engine: Any = TimedEngine(times, tokens)
    _, records = robustness.run(engine, guides)
    assert robustness.ALONE_RUNS == 3
    assert [r["healthy_alone_s"] for r in records] == [2.0, 0.5]  # medians, not the first run
    assert [r["healthy_ratio"] for r in records] == [1.5, 1.0]
    assert [r["hostile_s"] for r in records] == [2.0, 2.0]
    assert [r["healthy_unchanged"] for r in records] == [True, False]  # one run alone differs
    assert engine.healthy_times == []
