"""Soundness on public data: every output that random-logits guided generation completes
(samples a stop token) follows its guide, checked by an independent oracle.

Oracles: ``jsonschema`` (the schema's declared draft, formats as annotations) for JSON schemas;
``re.fullmatch(..., re.ASCII)`` for regexes, the reading both backends follow (patterns Python
cannot parse, and ``(?i)`` ones, are left unchecked with the reason); the *other* backend for
EBNF and Lark grammars (plus ``json.loads`` and the root's type for the JSON ones, which judge
alone where the other backend refuses the grammar). Guides a backend refuses are counted, not
failed. Counts go to the session summary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

import summary
from datasets import DATASETS, SEED, Case, load, with_slow_marks
from guidedec import (
    GrammarMatcherFactory,
    GuidedDecodingConfig,
    TokenizerInfo,
)
from guidedec.errors import GuidedecError
from guidedec.testing import GeneratedOutput, feed_tokens, make_decoder, random_guided_generate
from known_limits import allowed
from oracles import UNCHECKED, json_schema_verdict, python_regex

BATCH_SIZE = 32  # guides per GuidedDecoder batch
# Under random logits an output ends only by chance; those that do mostly end within ~30 tokens,
# and the rest would run to any limit (long strings, numbers, extra properties).
MAX_TOKENS = 32
MIN_OUTPUTS = 16  # a smaller data set is repeated (each copy gets its own random logits)
OTHER_BACKEND = {"xgrammar": "llguidance", "llguidance": "xgrammar"}


@dataclass(slots=True)
class Verdict:
    """An invalid completed output and why."""

    case: Case
    text: str
    reason: str


def batches(items: Sequence[Case], size: int) -> Iterator[Sequence[Case]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def compiled_cases(factory: GrammarMatcherFactory, cases: Sequence[Case]) -> list[Case]:
    compiled = []
    for case in cases:
        try:
            factory.create(case.params)
        except GuidedecError:
            continue
        compiled.append(case)
    return compiled


def repeated(cases: list[Case]) -> list[Case]:
    """At least ``MIN_OUTPUTS`` runs: a small data set's cases are repeated."""
    if not cases or len(cases) >= MIN_OUTPUTS:
        return cases
    return [cases[i % len(cases)] for i in range(MIN_OUTPUTS)]


def generate(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, backend: str, cases: list[Case]
) -> list[GeneratedOutput]:
    decoder = make_decoder(
        tokenizer,
        backend,  # type: ignore[arg-type]
        factory=factory,
        max_num_sequences=BATCH_SIZE,
    )
    # The backend's masks alone: the decoder's restriction of xgrammar's first rows to a
    # schema's root types is tested in tests/grammar/test_root_types.py.
    decoder.rules.root_types = False
    outputs: list[GeneratedOutput] = []
    for n, batch in enumerate(batches(cases, BATCH_SIZE)):
        guides = [case.params for case in batch]
        outputs += random_guided_generate(decoder, guides, seed=SEED + n, max_tokens=MAX_TOKENS)
    return outputs


def effective_backend(factory: GrammarMatcherFactory, case: Case, backend: str) -> str:
    """The backend that enforces ``case`` (``auto`` remembers the one that compiled it)."""
    if backend != "auto":
        return backend
    return str(factory.chosen_backend(case.params))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Oracle:
    """Judges completed outputs without the backend that produced them."""

    tokenizer: TokenizerInfo
    make_factory: Callable[..., GrammarMatcherFactory]
    max_json_whitespace: int

    def judge(self, case: Case, output: GeneratedOutput, enforced_by: str) -> str | None:
        """None if the completed ``output`` follows its guide, else the reason."""
        text = self.tokenizer.decode(output.token_ids)
        if case.kind == "json":
            return json_schema_verdict(case.guide, text, max_whitespace=self.max_json_whitespace)
        if case.kind == "regex":
            pattern, why_not = python_regex(case.guide)
            if pattern is None:
                return f"{UNCHECKED}: {why_not}"
            return None if pattern.fullmatch(text) else "re.fullmatch fails"
        reason = self.other_backend_verdict(case, output, OTHER_BACKEND[enforced_by])
        if case.json_root is None or (reason is not None and not reason.startswith(UNCHECKED)):
            return reason
        return json_schema_verdict({"type": case.json_root}, text, max_whitespace=len(text))

    def other_backend_verdict(self, case: Case, output: GeneratedOutput, other: str) -> str | None:
        """None if backend ``other`` accepts the same tokens and then a stop token."""
        try:
            matcher = self.make_factory(other).create(case.params)
        except GuidedecError as exc:
            return f"{UNCHECKED}: {other} cannot compile it ({str(exc)[:80]})"
        tokens = output.token_ids
        try:
            if feed_tokens(matcher, tokens) == len(tokens) and matcher.accept_token(
                self.tokenizer.eos_token_id
            ):
                return None
        except GuidedecError as exc:
            return f"{other} fails: {exc}"
        return f"{other} rejects it"


def failure_report(verdicts: Sequence[Verdict], backend: str) -> str:
    lines = [f"{len(verdicts)} invalid terminated outputs on {backend}:"]
    for v in verdicts[:20]:
        lines.append(f"- {v.case.case_id}: {v.reason}")
        lines.append(f"  guide:  {str(v.case.params.guide)[:300]}")
        lines.append(f"  output: {v.text[:300]!r}")
    return "\n".join(lines)


def judge_all(
    oracle: Oracle,
    factory: GrammarMatcherFactory,
    dataset: str,
    backend: str,
    runs: Sequence[Case],
    outputs: Sequence[GeneratedOutput],
) -> tuple[Counter[str], list[Verdict]]:
    """Counts of the outputs' verdicts, and the invalid outputs no documented limit explains."""
    counts: Counter[str] = Counter()
    invalid: list[Verdict] = []
    for case, output in zip(runs, outputs, strict=True):
        counts["errors"] += output.error is not None
        if not output.finished:
            continue
        counts["terminated"] += 1
        reason = oracle.judge(case, output, effective_backend(factory, case, backend))
        if reason is None:
            counts["valid"] += 1
        elif reason.startswith(UNCHECKED):
            counts["unchecked"] += 1
        elif allowed(dataset, case.case_id, backend, "unsound"):
            counts["allowed"] += 1
        else:
            text = oracle.tokenizer.decode(output.token_ids)
            invalid.append(Verdict(case, text, reason))
    counts["invalid"] = len(invalid)
    return counts, invalid


@pytest.mark.data
@pytest.mark.parametrize("dataset", with_slow_marks(DATASETS))
def test_every_terminated_output_follows_its_guide(
    dataset: str,
    backend: str,
    tokenizer: TokenizerInfo,
    make_factory: Callable[..., GrammarMatcherFactory],
    request: pytest.FixtureRequest,
) -> None:
    cases = load(dataset)
    factory = make_factory(backend)
    compiled = compiled_cases(factory, cases)
    runs = repeated(compiled)
    outputs = generate(factory, tokenizer, backend, runs)
    # make_factory's configuration: "flexible" JSON whitespace, with bounded runs.
    max_whitespace = GuidedDecodingConfig(tokenizer=tokenizer).json_whitespace_limit
    oracle = Oracle(tokenizer, make_factory, max_whitespace)
    counts, invalid = judge_all(oracle, factory, dataset, backend, runs, outputs)
    counts.update(cases=len(cases), compiled=len(compiled), outputs=len(outputs))
    summary.record(request, dataset, backend, "gen", counts)
    assert not invalid, failure_report(invalid, backend)
