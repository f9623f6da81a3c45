"""The engine's batched forward against the per-sequence runner, token for token in float64:
requests joining and leaving (more requests than slots), prefill chunks next to decodes, n-gram
and draft-model speculation; and faults inside a batched step (the end of the context, a grammar
dead end, a failed compile, an abort) that finish their own request only, the healthy requests
giving exactly what they give alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.engine.batched_runner import BatchedModelRunner
from guidedec.engine.masked_forward import MaskedForward
from guidedec.engine.runner import ModelRunner
from guidedec.grammar.matcher import GrammarMatcher, GrammarMatcherFactory, WrappedFactory

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
JSON = GuidedDecodingParams(json_schema=SCHEMA)
REGEX = GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,3}")
PROMPTS = [
    "Repeat: a b c a b c a b c",
    "Describe a person:",
    "A long prompt that needs several chunks of prefill before it decodes anything " * 2,
    "List:",
    "Answer yes or no:",
    "Free text",
]
GUIDES = [JSON, None, JSON, REGEX, REGEX, None]


def _engine(*, per_sequence: bool = False, **options: Any) -> LLM:
    llm = LLM(
        "tiny-random",
        max_num_seqs=3,  # six requests: joins and leaves
        max_num_tokens=16,  # chunked prefill next to decodes
        dtype=torch.float64,
        json_whitespace="compact",
        **options,
    )
    assert isinstance(llm.runner, BatchedModelRunner)
    if per_sequence:
        llm.runner = ModelRunner(llm.model, max_num_seqs=3)
    return llm


def _params(max_tokens: int = 28) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=max_tokens + 2 * i, guided_decoding=g)
        for i, g in enumerate(GUIDES)
    ]


def _run(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> list[Any]:
    outputs = llm.generate(prompts, params)
    llm.close()
    return [(o.token_ids, o.finish_reason, o.error) for o in outputs]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"speculative": "ngram", "num_draft_tokens": 3},
        {"speculative": "draft:tiny-random-draft"},
    ],
    ids=["plain", "ngram", "draft"],
)
def test_batched_engine_equals_the_per_sequence_engine_token_for_token(
    options: dict[str, Any],
) -> None:
    expected = _run(_engine(per_sequence=True, **options), PROMPTS, _params())
    llm = _engine(**options)
    actual = _run(llm, PROMPTS, _params())
    assert actual == expected
    assert all(error is None for _, _, error in actual)
    assert {reason for _, reason, _ in actual} >= {"stop", "length"}
    assert llm.stats.steps < sum(len(tokens) for tokens, _, _ in actual)  # steps were shared


class _DeadEndMatcher(GrammarMatcher):
    """``inner`` until it has accepted ``after`` tokens; then every mask row allows nothing."""

    def __init__(self, inner: GrammarMatcher, after: int) -> None:
        self.inner, self.after, self.accepted = inner, after, 0

    def accept_token(self, token_id: int) -> bool:
        ok = self.inner.accept_token(token_id)
        self.accepted += ok
        return ok

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
        self.accepted -= num_tokens

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        self.inner.fill_next_token_bitmask(bitmask, index)
        if self.accepted >= self.after:
            bitmask[index].zero_()

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()


class _DeadEndFactory(WrappedFactory):
    """``inner``'s matchers; those of ``target`` (by identity) reach a dead end."""

    def __init__(self, inner: GrammarMatcherFactory, target: GuidedDecodingParams) -> None:
        super().__init__(inner)
        self.target = target

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        matcher = self.inner.create(params)
        return _DeadEndMatcher(matcher, after=3) if params is self.target else matcher


def test_faults_in_a_batched_step_finish_only_their_own_request() -> None:
    healthy = [0, 1, 3]
    alone = {i: _run(_engine(), [PROMPTS[i]], [_params()[i]])[0] for i in healthy}
    llm = _engine(max_model_len=40)
    dead_end = GuidedDecodingParams(json_schema=SCHEMA)  # same guide, its own matcher
    llm.decoder.factory = _DeadEndFactory(llm.decoder.factory, dead_end)
    faulty = {
        "context": (PROMPTS[2][:100], SamplingParams(max_tokens=200)),
        "dead_end": (PROMPTS[1], SamplingParams(max_tokens=20, guided_decoding=dead_end)),
        "compile": (
            PROMPTS[4],
            SamplingParams(guided_decoding=GuidedDecodingParams(json_schema={"type": "nope"})),
        ),
        "abort": (PROMPTS[5], SamplingParams(max_tokens=200)),
    }
    ids = {i: llm.add_request(PROMPTS[i], _params()[i]) for i in healthy}
    fault_ids = {name: llm.add_request(p, s) for name, (p, s) in faulty.items()}
    done: dict[int, Any] = {}
    steps = 0
    while llm.has_unfinished_requests():
        steps += 1
        if steps == 6:
            assert llm.abort(fault_ids["abort"])
        done.update((o.request_id, o) for o in llm.step())
    llm.close()
    for i, request_id in ids.items():
        out = done[request_id]
        assert (out.token_ids, out.finish_reason, out.error) == alone[i]
    context = done[fault_ids["context"]]
    prompt_len = len(llm.tokenizer.encode(faulty["context"][0]))
    assert context.finish_reason == "length" and prompt_len + len(context.token_ids) == 40
    assert done[fault_ids["dead_end"]].finish_reason == "grammar_error"
    assert "dead end" in str(done[fault_ids["dead_end"]].error)
    assert len(done[fault_ids["dead_end"]].token_ids) == 3
    assert done[fault_ids["compile"]].finish_reason == "grammar_error"
    assert done[fault_ids["abort"]].finish_reason == "abort"
    assert len(llm.scheduler.free_slots) == 3


def test_sparse_rows_sample_the_tokens_of_masked_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampled guided rows that allow few tokens are drawn from their allowed logits alone: in
    float64 the engine gives the tokens it gives when it masks and samples every full row."""
    params = [
        SamplingParams(max_tokens=24, temperature=t, seed=i, guided_decoding=g)
        for i, (g, t) in enumerate(zip(GUIDES, [1.0, 0.7, 1.3, 1.0, 0.0, 1.0], strict=True))
    ]
    taken: list[int] = []
    take = MaskedForward._take_sparse_rows

    def counting(self: MaskedForward, *args: Any) -> dict[int, torch.Tensor]:
        rows = take(self, *args)
        taken.append(len(rows))
        return rows

    monkeypatch.setattr(MaskedForward, "_take_sparse_rows", counting)
    actual = _run(_engine(), PROMPTS, params)
    assert sum(taken) > 20  # the sparse path ran, on many rows
    monkeypatch.setattr(MaskedForward, "_take_sparse_rows", lambda *args: {})
    assert _run(_engine(), PROMPTS, params) == actual
