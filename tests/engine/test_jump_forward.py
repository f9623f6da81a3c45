"""Jump-forward: the tokens a grammar forces are proposed as drafts and verified, and change no
output. Oracles: the engine without jump-forward, token for token (float64, greedy), and the
matcher itself (forced tokens are accepted one after another by a fresh matcher fed the same
prefix, and the matcher's mask is the same before and after the call)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bitmask import allocate_bitmask
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.tokenizer import TokenizerInfo

BACKENDS = ["xgrammar", "llguidance"]
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 10},
        "order_status": {"enum": ["approved_by_manager", "rejected_by_finance"]},
        "shipping_priority_level": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["customer_full_name", "order_status", "shipping_priority_level"],
    "additionalProperties": False,
}
GUIDES = {
    "json": GuidedDecodingParams(json_schema=LONG_KEYS),
    "regex": GuidedDecodingParams(regex=r"(status|state)=(ready|waiting)-[0-9]{2}"),
    "ebnf": GuidedDecodingParams(ebnf='root ::= "begin transaction " [0-9] [0-9]? " end"'),
    "choice": GuidedDecodingParams(choice=["international shipping", "domestic pickup"]),
}
PREFIXES = {
    "json": ['{"customer_full_name":"ab","order_status":"appr', '{"cus', ""],
    "regex": ["sta", "status=", "state=wai"],
    "ebnf": ["", "begin transaction 4"],
    "choice": ["intern", "dom", ""],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(GUIDES))
def test_forced_tokens_are_accepted_and_leave_the_state(
    backend: str,
    name: str,
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
) -> None:
    factory = make_factory(backend)
    rows = allocate_bitmask(2, tokenizer.vocab_size)
    found = 0
    for prefix in PREFIXES[name]:
        matcher = factory.create(GUIDES[name])
        assert all(matcher.accept_token(t) for t in tokenizer.encode(prefix))
        matcher.fill_next_token_bitmask(rows, 0)
        forced = matcher.forced_tokens()
        matcher.fill_next_token_bitmask(rows, 1)
        assert torch.equal(rows[0], rows[1])  # the state is as it was
        fresh = factory.create(GUIDES[name])
        assert all(fresh.accept_token(t) for t in tokenizer.encode(prefix))
        assert all(fresh.accept_token(t) for t in forced), (prefix, forced)
        found += len(forced)
    assert found > 0  # each guide forces text somewhere


def _run(
    backend: str, jump_forward: bool, guides: list[GuidedDecodingParams | None], **options: object
) -> tuple[list[tuple[list[int], str]], LLM]:
    llm = LLM(
        "tiny-random",
        backend=backend,  # type: ignore[arg-type]
        max_num_seqs=3,
        dtype=torch.float64,
        json_whitespace="compact",
        jump_forward=jump_forward,
        isolate_compiles=False,
        **options,  # type: ignore[arg-type]
    )
    params = [SamplingParams(max_tokens=90 if g else 12, guided_decoding=g) for g in guides]
    outputs = llm.generate([f"Record {i}:" for i in range(len(guides))], params)
    llm.close()
    return [(o.token_ids, o.finish_reason) for o in outputs], llm


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_outputs_are_the_same_with_jump_forward(backend: str) -> None:
    """Every guide type, an unguided request beside them (batching: a sequence that jumps
    verifies its chunk while the others decode one token), float64."""
    guides: list[GuidedDecodingParams | None] = [*GUIDES.values(), None]
    plain, off = _run(backend, False, guides)
    jumped, on = _run(backend, True, guides)
    assert jumped == plain
    assert on.stats.forced_draft_tokens > 0
    assert 0 < on.stats.accepted_forced_tokens <= on.stats.forced_draft_tokens
    assert on.stats.steps < off.stats.steps
    assert off.stats.forced_draft_tokens == 0


def test_jump_forward_with_ngram_drafts_after_the_forced_ones() -> None:
    guides: list[GuidedDecodingParams | None] = [GUIDES["json"], GUIDES["regex"]]
    plain, _ = _run("llguidance", False, guides)
    both, llm = _run("llguidance", True, guides, speculative="ngram", num_draft_tokens=6)
    assert both == plain
    assert llm.stats.draft_tokens >= llm.stats.forced_draft_tokens > 0


def test_the_long_keys_schema_takes_far_fewer_steps() -> None:
    """llguidance forces canonical tokens, which a greedy target accepts."""
    plain, off = _run("llguidance", False, [GUIDES["json"]])
    jumped, on = _run("llguidance", True, [GUIDES["json"]])
    assert jumped == plain
    assert on.stats.steps <= 0.7 * off.stats.steps


def test_the_engines_auto_guides_json_with_llguidance() -> None:
    """xgrammar's masks allow any split of forced text, and a model that takes another split
    than the drafted one rejects the rest of the draft: the engine's ``auto`` puts llguidance
    first for JSON guides (its masks keep the tokenizer's split), with jump-forward on or off
    so that turning it off changes no output, and every forced draft of the long-keys schema
    is accepted."""
    plain, off = _run("auto", False, [GUIDES["json"]])
    jumped, on = _run("auto", True, [GUIDES["json"]])
    assert jumped == plain
    for llm in (off, on):
        assert llm.factory.chosen_backend(GUIDES["json"]) == "llguidance"  # type: ignore[attr-defined]
    assert on.stats.accepted_forced_tokens == on.stats.forced_draft_tokens > 0
    assert on.stats.steps <= 0.7 * off.stats.steps


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picks=st.lists(st.sampled_from(sorted(GUIDES)), min_size=1, max_size=3),
    backend=st.sampled_from(BACKENDS),
    budget=st.integers(min_value=2, max_value=40),
)
def test_mixes_and_budgets_change_no_output(picks: list[str], backend: str, budget: int) -> None:
    """A forced span longer than the budget is cut to it (the drafter proposes less)."""
    guides = [GUIDES[name] for name in picks]
    outputs = {}
    for jump in (False, True):
        llm = LLM(
            "tiny-random",
            backend=backend,  # type: ignore[arg-type]
            max_num_seqs=2,
            dtype=torch.float64,
            jump_forward=jump,
            isolate_compiles=False,
        )
        params = [
            SamplingParams(max_tokens=budget, guided_decoding=g, close_within_budget=False)
            for g in guides
        ]
        outputs[jump] = [o.token_ids for o in llm.generate(["x"] * len(guides), params)]
        llm.close()
    assert outputs[True] == outputs[False]
    assert all(len(tokens) <= budget for tokens in outputs[True])


def test_jump_forward_refuses_a_draft_model() -> None:
    with pytest.raises(ValueError, match="not a draft model"):
        LLM("tiny-random", jump_forward=True, speculative="draft:tiny-random-draft")


def test_verified_drafts_keep_what_closing_learned() -> None:
    """A guide that cannot complete within the budget: closing searches once per request and
    then stops, with jump-forward too (a rollback of rejected forced tokens used to make it
    forget and search again at every step, each search costing its whole budget). xgrammar,
    whose masks let the model reject forced drafts, makes the rollbacks."""
    guide = GuidedDecodingParams(
        json_schema={"type": "array", "items": GUIDES["json"].json_schema, "minItems": 30}
    )
    no_fit = {}
    for jump in (False, True):
        llm = LLM(
            "tiny-random",
            backend="xgrammar",
            max_num_seqs=4,
            jump_forward=jump,
            isolate_compiles=False,
        )
        params = [
            SamplingParams(max_tokens=24, temperature=1.0, seed=i, guided_decoding=guide)
            for i in range(4)
        ]
        outputs = llm.generate([f"Record {i}" for i in range(4)], params)
        assert [o.finish_reason for o in outputs] == ["length"] * 4
        no_fit[jump] = llm.decoder.closer.stats.no_fit
        if jump:
            assert llm.stats.accepted_forced_tokens < llm.stats.forced_draft_tokens  # rollbacks
        llm.close()
    assert no_fit[True] == no_fit[False] == 4


NARROWED = {
    # llguidance narrows forced text to the tokenizer's own split: one token, no logits
    "one token": ("llguidance", "single_token_rows", "rows_without_logits"),
    # xgrammar allows several splits; structural positions a handful of tokens: those columns
    "few tokens": ("xgrammar", "sparse_rows", "rows_with_sparse_logits"),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("narrowed", sorted(NARROWED))
def test_narrowed_rows_take_less_of_the_lm_head_and_change_nothing(
    narrowed: str, temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a step that verifies drafts, a row whose mask allows one token gets no logits, and a
    row whose mask allows few gets the lm_head of those columns alone: the outputs, sampled or
    greedy, and their log-probabilities are those of a run that computes every row in full."""
    backend, finder, counter = NARROWED[narrowed]
    guides: list[GuidedDecodingParams | None] = [GUIDES["json"], GUIDES["choice"], None]
    # Closing off: with it, a request drafts nothing in the last window of its budget (here
    # all of its 60 tokens), where each sampled token is checked.
    params = [
        SamplingParams(
            max_tokens=60,
            temperature=temperature,
            seed=i,
            logprobs=2,
            guided_decoding=g,
            close_within_budget=False,
        )
        for i, g in enumerate(guides)
    ]
    runs = {}
    for narrow in (True, False):
        llm = LLM(
            "tiny-random",
            backend=backend,
            max_num_seqs=3,
            dtype=torch.float64,
            json_whitespace="compact",
            jump_forward=True,
            isolate_compiles=False,
        )
        if not narrow:
            monkeypatch.setattr(llm.decoder, finder, lambda *args: {})
        outputs = llm.generate([f"Record {i}:" for i in range(3)], params)
        runs[narrow] = (
            [o.token_ids for o in outputs],
            [[(e.token_id, round(e.logprob, 9)) for e in o.logprobs or []] for o in outputs],
            getattr(llm.stats, counter),
        )
        llm.close()
    assert runs[True][:2] == runs[False][:2]
    assert runs[True][2] > 0 and runs[False][2] == 0
