"""Labelled instances of public data: each valid instance is accepted token by token and then a
stop token, each invalid one is rejected, on every backend and ``auto``.

A mismatch is a false negative (valid instance rejected) or a false positive (invalid instance
accepted). Two causes are recognised automatically and counted apart: instance keys out of the
schema's ``properties`` order (both backends emit declared order), and JSON instances labelled
invalid only under ``format`` assertion. Every other mismatch must be a documented backend limit
in :mod:`known_limits`; counts go to the session summary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import summary
from datasets import DATASETS, Case, Instance, json_text, load, with_slow_marks
from guidedec import GrammarMatcherFactory, TokenizerInfo
from guidedec.errors import GuidedecError
from guidedec.testing import accepts_output
from known_limits import allowed, documented_mismatches
from oracles import is_valid_json_instance

INSTANCE_DATASETS = [name for name in DATASETS if name != "llama.cpp-gbnf"]  # it has none


def accepts(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, case: Case, text: str
) -> bool:
    try:
        return accepts_output(factory, tokenizer, case.params, text)
    except GuidedecError:  # a matcher error mid-output rejects the output
        return False


def property_ranks(schema: Any) -> dict[str, int]:
    """Each property name's first position among the schema's ``properties`` declarations."""
    ranks: dict[str, int] = {}
    stack = [schema]
    while stack:
        node = stack.pop(0)
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict):
                for name in properties:
                    ranks.setdefault(name, len(ranks))
            stack.extend(v for k, v in node.items() if k not in ("const", "enum", "default"))
    return ranks


def in_schema_order(value: Any, ranks: dict[str, int]) -> Any:
    """``value`` with every object's keys in declared order (undeclared keys last, in order)."""
    if isinstance(value, list):
        return [in_schema_order(v, ranks) for v in value]
    if not isinstance(value, dict):
        return value
    keys = sorted(value, key=lambda k: ranks.get(k, len(ranks)))
    return {k: in_schema_order(value[k], ranks) for k in keys}


def mismatch_cause(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, case: Case, instance: Instance
) -> str | None:
    """The automatically recognised cause of a mismatch, if any."""
    if case.kind != "json":
        return None
    if instance.valid:
        reordered = in_schema_order(instance.data, property_ranks(case.guide))
        text = json_text(reordered)
        if text != instance.text and accepts(factory, tokenizer, case, text):
            return "order"
    elif is_valid_json_instance(case.guide, instance.data):
        return "format"
    return None


@dataclass
class Tally:
    """The verdicts on one data set and backend."""

    dataset: str
    backend: str
    counts: Counter[str] = field(default_factory=Counter)
    unexplained: list[str] = field(default_factory=list)
    limits_used: set[str] = field(default_factory=set)  # case ids of documented limits

    def mismatch(self, case: Case, instance: Instance, cause: str | None) -> None:
        kind = "fn" if instance.valid else "fp"
        self.counts[kind] += 1
        if cause is not None:
            self.counts[f"{kind}_{cause}"] += 1
        elif allowed(self.dataset, case.case_id, self.backend, kind):
            self.counts[f"{kind}_allowed"] += 1
            self.limits_used.add(case.case_id)
        else:
            self.unexplained.append(f"{kind.upper()} {case.case_id}: {instance.text[:200]!r}")

    def unused_limits(self) -> list[str]:
        documented = documented_mismatches(self.dataset, self.backend, {"fp", "fn"})
        return [case_id for case_id in documented if case_id not in self.limits_used]


def check_case(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, case: Case, tally: Tally
) -> None:
    tally.counts["cases"] += 1
    try:
        factory.create(case.params)
    except GuidedecError:
        return
    tally.counts["compiled"] += 1
    for instance in case.instances:
        tally.counts["valid" if instance.valid else "invalid"] += 1
        if accepts(factory, tokenizer, case, instance.text) != instance.valid:
            tally.mismatch(case, instance, mismatch_cause(factory, tokenizer, case, instance))


@pytest.mark.data
@pytest.mark.parametrize("dataset", with_slow_marks(INSTANCE_DATASETS))
def test_valid_instances_are_accepted_and_invalid_ones_rejected(
    dataset: str,
    backend: str,
    tokenizer: TokenizerInfo,
    make_factory: Callable[..., GrammarMatcherFactory],
    request: pytest.FixtureRequest,
) -> None:
    factory = make_factory(backend)
    tally = Tally(dataset, backend)
    for case in load(dataset):
        check_case(factory, tokenizer, case, tally)
    summary.record(
        request, dataset, backend, "inst", tally.counts, stale_limits=tally.unused_limits()
    )
    unexplained = tally.unexplained
    assert not unexplained, f"{len(unexplained)} unexplained on {backend}:\n" + "\n".join(
        unexplained[:100]
    )
