"""Speculative decoding is exact: same greedy output with and without drafts, on both backends.

The runner (``guidedec.testing.GreedyRunner``) checks, at every step, each filled row against a
fresh matcher fed the accepted tokens plus the draft prefix, and each matcher's state against a
fresh matcher fed the accepted tokens; these tests check its output against plain greedy decoding
computed without the decoder.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guidedec import (
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingParams,
    TokenizerInfo,
    testing,
)
from guidedec.bitmask import apply_bitmask
from guidedec.testing import (
    GeneratedOutput,
    GreedyDrafter,
    GreedyRunner,
    RandomDrafter,
    ScriptedTarget,
    next_token_mask,
)

BACKENDS = ["xgrammar", "llguidance"]
MAX_TOKENS = 40
JSON = GuidedDecodingParams(
    json_schema={
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "tag": {"enum": ["a", "bc", "def"]},
            "n": {"type": "integer", "minimum": -50, "maximum": 999},
        },
        "required": ["ok", "tag", "n"],
        "additionalProperties": False,
    }
)
REGEX = GuidedDecodingParams(regex=r"(yes|no|maybe)-[0-9]{1,3}!")
EBNF = GuidedDecodingParams(
    ebnf='root ::= "[" item ("," item)? ("," item)? "]"\nitem ::= "true" | "false" | [0-9] [0-9]?'
)
GUIDES = [JSON, REGEX, EBNF, None]
TOKEN_DRAFTERS = ["greedy", "random", "valid-wrong", "stop-inside", "overlong"]
DRAFTERS = [*TOKEN_DRAFTERS, "model-same", "model-other"]


@pytest.fixture(scope="module")
def target(tokenizer: TokenizerInfo) -> ScriptedTarget:
    return ScriptedTarget(tokenizer.vocab_size, seed=11)


@pytest.fixture(scope="module")
def compact_factory(
    make_factory: Callable[..., GrammarMatcherFactory],
) -> Callable[[str], GrammarMatcherFactory]:
    return lambda backend: make_factory(backend, "compact")


def make_decoder(
    tokenizer: TokenizerInfo, factory: GrammarMatcherFactory, backend: str, drafts: int
) -> GuidedDecoder:
    return testing.make_decoder(
        tokenizer,
        backend,  # type: ignore[arg-type]
        factory=factory,
        max_num_sequences=len(GUIDES),
        max_num_draft_tokens=drafts,
        json_whitespace="compact",
    )


def naive_greedy(
    factory: GrammarMatcherFactory,
    target: ScriptedTarget,
    params: GuidedDecodingParams | None,
    index: int,
    stop_ids: set[int],
) -> GeneratedOutput:
    """Guided greedy decoding of one sequence with a bare matcher and the torch reference apply."""
    matcher = None if params is None else factory.create(params)
    tokens: list[int] = []
    while len(tokens) < MAX_TOKENS:
        logits = target.logits([[index, *tokens]])
        if matcher is not None and not matcher.is_terminated():
            row = next_token_mask(matcher, target.vocab_size).unsqueeze(0)
            apply_bitmask(logits, row, backend="torch")
        token = int(torch.argmax(logits[0]))
        if matcher is not None and not matcher.is_terminated():
            assert matcher.accept_token(token)
        if token in stop_ids:
            return GeneratedOutput(tokens, True)
        tokens.append(token)
    return GeneratedOutput(tokens, False)


@cache
def _baseline(backend: str, factory: GrammarMatcherFactory, target: ScriptedTarget, stops):
    return [naive_greedy(factory, target, params, i, set(stops)) for i, params in enumerate(GUIDES)]


def make_drafter(name: str, backend_factory, target, tokenizer: TokenizerInfo):
    eos = tokenizer.eos_token_id
    return {
        "greedy": lambda: GreedyDrafter(target, backend_factory, GUIDES, eos),
        "random": lambda: RandomDrafter(tokenizer.vocab_size, seed=5),
        "valid-wrong": lambda: GreedyDrafter(target, backend_factory, GUIDES, eos, rank=1),
        "stop-inside": lambda: GreedyDrafter(
            target, backend_factory, GUIDES, eos, stop_at=1, past_stop=True
        ),
        "overlong": lambda: GreedyDrafter(target, backend_factory, GUIDES, eos, past_stop=True),
    }[name]()


def run_speculative(
    tokenizer, factory, target, backend: str, drafter_name: str, k: int, rollback="batch"
) -> GreedyRunner:
    decoder = make_decoder(tokenizer, factory, backend, k)
    kwargs: dict = {"num_draft_tokens": k, "max_tokens": MAX_TOKENS, "oracle": factory}
    if drafter_name.startswith("model-"):
        seed = target.seed if drafter_name == "model-same" else target.seed + 1
        kwargs["draft_model"] = ScriptedTarget(tokenizer.vocab_size, seed=seed)
    else:
        kwargs["drafter"] = make_drafter(drafter_name, factory, target, tokenizer)
    return GreedyRunner(decoder, target, rollback=rollback, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_runner_without_drafts_is_plain_guided_greedy(
    backend, tokenizer, compact_factory, target
) -> None:
    factory = compact_factory(backend)
    runner = GreedyRunner(
        make_decoder(tokenizer, factory, backend, 0), target, max_tokens=MAX_TOKENS, oracle=factory
    )
    outputs = runner.run(GUIDES)
    expected = _baseline(backend, factory, target, tokenizer.stop_token_ids)
    assert outputs == expected
    # The guided outputs end with a stop token; the unguided one runs to max_tokens.
    assert [o.finished for o in outputs] == [True, True, True, False]
    assert runner.stats.states_checked > 0 and runner.stats.rows_checked > 0


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_speculation_gives_the_tokens_of_plain_greedy(
    backend, drafter, k, tokenizer, compact_factory, target
) -> None:
    factory = compact_factory(backend)
    runner = run_speculative(tokenizer, factory, target, backend, drafter, k)
    outputs = runner.run(GUIDES)
    assert outputs == _baseline(backend, factory, target, tokenizer.stop_token_ids)
    stats = runner.stats
    assert stats.rows_checked > 0 and stats.states_checked > 0
    assert stats.drafts_proposed > 0
    if drafter in ("greedy", "model-same"):
        assert stats.drafts_accepted == stats.drafts_proposed
        assert stats.steps < MAX_TOKENS  # several tokens per step
    if drafter in ("random", "valid-wrong", "model-other"):
        assert stats.drafts_accepted < stats.drafts_proposed
    if drafter == "overlong" or (drafter == "stop-inside" and k >= 3):
        assert stats.stops_inside_drafts > 0  # verification accepted past the stop token


@pytest.mark.parametrize("drafter", TOKEN_DRAFTERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_rolling_back_from_the_next_snapshots_is_exact_too(
    backend, drafter, tokenizer, compact_factory, target
) -> None:
    factory = compact_factory(backend)
    runner = run_speculative(tokenizer, factory, target, backend, drafter, 3, rollback="snapshot")
    assert runner.run(GUIDES) == _baseline(backend, factory, target, tokenizer.stop_token_ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flexible_whitespace_and_max_tokens_cut_are_exact(
    backend, tokenizer, make_factory, target
) -> None:
    factory = make_factory(backend)  # flexible JSON whitespace: outputs run to max_tokens
    guides = [JSON, GuidedDecodingParams(json_schema={"type": "array"}), REGEX, EBNF]
    decoders = [
        testing.make_decoder(
            tokenizer,
            backend,  # type: ignore[arg-type]
            factory=factory,
            max_num_sequences=4,
            max_num_draft_tokens=k,
        )
        for k in (0, 4)
    ]
    plain = GreedyRunner(decoders[0], target, max_tokens=MAX_TOKENS).run(guides)
    drafter = GreedyDrafter(target, factory, guides, tokenizer.eos_token_id, past_stop=True)
    runner = GreedyRunner(
        decoders[1],
        target,
        drafter=drafter,
        num_draft_tokens=4,
        max_tokens=MAX_TOKENS,
        oracle=factory,
    )
    assert runner.run(guides) == plain
    assert any(not o.finished and len(o.token_ids) == MAX_TOKENS for o in plain)


class ScriptDrafter:
    """Draft positions follow a drawn script of actions: the valid token of some rank in the
    target's logits, a stop token, or a random token."""

    def __init__(self, greedy: list[GreedyDrafter], actions: list[int], vocab_size: int):
        self.greedy, self.actions, self.vocab_size = greedy, actions, vocab_size
        self.calls = 0

    def propose(self, prompt, tokens, count):
        self.calls += 1
        action = self.actions[self.calls % len(self.actions)]
        if action < len(self.greedy):
            return self.greedy[action].propose(prompt, tokens, count)
        seed = hash((self.calls, *tokens)) % self.vocab_size
        return [(seed * (i + 7)) % self.vocab_size for i in range(count)]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    actions=st.lists(st.integers(0, 5), min_size=1, max_size=8),
    k=st.integers(1, 5),
    backend=st.sampled_from(BACKENDS),
)
def test_any_mix_of_drafts_is_exact(actions, k, backend, tokenizer, compact_factory, target):
    factory = compact_factory(backend)
    eos = tokenizer.eos_token_id
    greedy = [
        GreedyDrafter(target, factory, GUIDES, eos),
        GreedyDrafter(target, factory, GUIDES, eos, rank=1),
        GreedyDrafter(target, factory, GUIDES, eos, rank=2, past_stop=True),
        GreedyDrafter(target, factory, GUIDES, eos, stop_at=k // 2, past_stop=True),
        GreedyDrafter(target, factory, GUIDES, eos, past_stop=True),
    ]
    drafter = ScriptDrafter(greedy, actions, tokenizer.vocab_size)
    runner = GreedyRunner(
        make_decoder(tokenizer, factory, backend, k),
        target,
        drafter=drafter,
        num_draft_tokens=k,
        max_tokens=MAX_TOKENS,
        oracle=factory,
    )
    assert runner.run(GUIDES) == _baseline(backend, factory, target, tokenizer.stop_token_ids)
