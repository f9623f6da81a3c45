"""The four-operation matcher contract, run against every backend and ``auto``."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import (
    GrammarMatcherFactory,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    TokenizerInfo,
    create_grammar_matcher_factory,
)
from guidedec.bitmask import allocate_bitmask, bitmask_size
from guidedec.grammar.matcher import FILLED, REJECTED, TERMINATED, GrammarMatcher, WrappedMatcher
from guidedec.testing import accepts_output, allowed_token_ids, feed_tokens, next_token_mask

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age"],
}
PERSON_TEXT = '{"name": "Ada", "age": 36, "tags": ["math", "engines"]}'

# One valid and one invalid output per guide type; both must get the same verdict everywhere.
GUIDE_CASES = [
    (GuidedDecodingParams(json_object=True), '{"x": [1, 2, {"y": null}]}', "[1, 2]"),
    (GuidedDecodingParams(json_schema=PERSON), PERSON_TEXT, '{"name": "Ada"}'),
    (GuidedDecodingParams(json_schema=json.dumps(PERSON)), PERSON_TEXT, '{"age": 3}'),
    (GuidedDecodingParams(regex=r"[a-z]+@[a-z]+\.com"), "ada@lovelace.com", "ada@lovelace"),
    (GuidedDecodingParams(ebnf='root ::= "(" [0-9]+ ("+" [0-9]+)* ")"'), "(1+23+4)", "(1+)"),
    (GuidedDecodingParams(lark='start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]+/'), "(12+3)", "()"),
    (GuidedDecodingParams(choice=["yes", "no", "maybe so"]), "maybe so", "maybe"),
]


# EBNF that only llama.cpp reads as it stands: an empty alternative, "." for any character and
# "{,n}" (xgrammar itself refuses all three; its backend compiles normalize_ebnf of the guide).
GBNF_ONLY = 'root ::= "<" . "|" sign digits ">"\nsign ::= | "-"\ndigits ::= [0-9]{,3}\n'
GBNF_ONLY_VERDICTS = {
    "<x|12>": True,
    "<é|-7>": True,
    "<x|>": True,
    "<x|-123>": True,
    "<|1>": False,
    "<xy|1>": False,
    "<x|1234>": False,
    "<x|+1>": False,
    "<x|--1>": False,
}


def test_llama_cpp_only_ebnf_forms_are_accepted_identically_on_xgrammar_and_llguidance(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo
) -> None:
    params = GuidedDecodingParams(ebnf=GBNF_ONLY)
    verdicts = {
        backend: {
            text: accepts_output(make_factory(backend), tokenizer, params, text)
            for text in GBNF_ONLY_VERDICTS
        }
        for backend in ("xgrammar", "llguidance")
    }
    assert verdicts["xgrammar"] == verdicts["llguidance"] == GBNF_ONLY_VERDICTS


@pytest.mark.parametrize(("params", "valid", "invalid"), GUIDE_CASES)
def test_every_guide_type_accepts_valid_and_rejects_invalid_output(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, params, valid: str, invalid: str
) -> None:
    assert accepts_output(factory, tokenizer, params, valid)
    assert not accepts_output(factory, tokenizer, params, invalid)


def test_rejected_token_leaves_the_state_unchanged(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo
) -> None:
    matcher = factory.create(GuidedDecodingParams(json_schema=PERSON))
    feed_tokens(matcher, tokenizer.encode('{"name": "Ada", "age"'))
    before = next_token_mask(matcher, tokenizer.vocab_size)
    for bad in tokenizer.encode("}]x"):
        assert not matcher.accept_token(bad)
    assert torch.equal(next_token_mask(matcher, tokenizer.vocab_size), before)
    assert feed_tokens(matcher, tokenizer.encode(": 1}")) == len(tokenizer.encode(": 1}"))


@pytest.mark.parametrize(("params", "valid", "_invalid"), GUIDE_CASES)
def test_advance_moves_as_accept_token_does(
    factory: GrammarMatcherFactory,
    tokenizer: TokenizerInfo,
    params: GuidedDecodingParams,
    valid: str,
    _invalid: str,
) -> None:
    """``advance`` (the decoder's accept for a token it cannot go on without) gives the same
    answers and the same states as ``accept_token``; a rejection is reported (the matcher may
    be unusable after it, so each rejected probe gets a fresh one)."""
    checked, unchecked = factory.create(params), factory.create(params)
    ids = [*tokenizer.encode(valid), tokenizer.eos_token_id]
    for token in ids:
        assert torch.equal(
            next_token_mask(unchecked, tokenizer.vocab_size),
            next_token_mask(checked, tokenizer.vocab_size),
        )
        assert unchecked.advance(token) is checked.accept_token(token) is True
    assert unchecked.is_terminated() and checked.is_terminated()
    assert unchecked.advance(ids[0]) is False  # terminated, as accept_token
    unchecked.rollback(2)  # the stop token and the last text token
    checked.rollback(2)
    assert torch.equal(
        next_token_mask(unchecked, tokenizer.vocab_size),
        next_token_mask(checked, tokenizer.vocab_size),
    )
    middle = tokenizer.encode(valid)[:-1]
    for prefix in ([], middle):
        probe = factory.create(params)
        feed_tokens(probe, prefix)
        allowed = allowed_token_ids(
            next_token_mask(probe, tokenizer.vocab_size), tokenizer.vocab_size
        )
        rejected = [t for t in range(tokenizer.vocab_size) if t not in allowed][:3]
        for token in rejected:
            rejecting = factory.create(params)
            assert feed_tokens(rejecting, prefix) == len(prefix)
            assert rejecting.advance(token) is False, token
    for outside in (-1, tokenizer.vocab_size):
        assert factory.create(params).advance(outside) is False


@pytest.mark.parametrize("wrapped", [False, True], ids=["backend", "base class"])
@pytest.mark.parametrize(("params", "valid", "_invalid"), GUIDE_CASES)
def test_advance_and_fill_does_what_its_three_calls_do(
    factory: GrammarMatcherFactory,
    tokenizer: TokenizerInfo,
    params: GuidedDecodingParams,
    valid: str,
    _invalid: str,
    wrapped: bool,
) -> None:
    """``advance_and_fill`` (the backend's own, or the base class's through a wrapper) gives
    the same status, state and row as advance, ``is_terminated`` and the fill, in any row of
    a several-row bitmask, and a rejected token fills nothing."""
    vocab = tokenizer.vocab_size

    def make() -> GrammarMatcher:
        matcher = factory.create(params)
        return WrappedMatcher(matcher) if wrapped else matcher

    fused, separate = make(), make()
    bitmask, reference = allocate_bitmask(3, vocab), allocate_bitmask(3, vocab)
    ids = [*tokenizer.encode(valid), tokenizer.eos_token_id]
    for position, token in enumerate(ids):
        row = position % 3
        bitmask[row] = reference[row] = 0
        status = fused.advance_and_fill(token, bitmask, row)
        assert separate.accept_token(token)
        if separate.is_terminated():
            assert status == TERMINATED and fused.is_terminated(), position
            assert not bitmask[row].any()
            break
        separate.fill_next_token_bitmask(reference, row)
        assert status == FILLED, position
        assert torch.equal(bitmask, reference), position
    else:
        raise AssertionError("the valid output never terminated")
    fused.rollback(2)  # the stop token and the last text token
    separate.rollback(2)
    assert torch.equal(next_token_mask(fused, vocab), next_token_mask(separate, vocab))
    assert fused.advance_and_fill(ids[-2], bitmask, 1) == FILLED
    assert fused.advance_and_fill(tokenizer.eos_token_id, bitmask, 2) == TERMINATED
    bitmask.fill_(-1)
    assert fused.advance_and_fill(ids[0], bitmask, 0) == REJECTED  # terminated
    probe = make()  # a rejection may leave a backend's matcher unusable: a fresh one
    assert feed_tokens(probe, ids[:-2]) == len(ids) - 2
    allowed = allowed_token_ids(next_token_mask(probe, vocab), vocab)
    rejected = next(t for t in range(vocab) if t not in allowed)
    assert probe.advance_and_fill(rejected, bitmask, 1) == REJECTED
    assert bool((bitmask == -1).all())  # nothing written


def test_stop_token_is_allowed_only_when_the_output_is_complete(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo
) -> None:
    matcher = factory.create(GuidedDecodingParams(json_schema=PERSON))
    ids = tokenizer.encode(PERSON_TEXT)
    for token in ids:
        assert tokenizer.eos_token_id not in allowed_token_ids(
            next_token_mask(matcher, tokenizer.vocab_size), tokenizer.vocab_size
        )
        assert matcher.accept_token(token)
    assert tokenizer.eos_token_id in allowed_token_ids(
        next_token_mask(matcher, tokenizer.vocab_size), tokenizer.vocab_size
    )
    assert not matcher.is_terminated()
    assert matcher.accept_token(tokenizer.eos_token_id)
    assert matcher.is_terminated()
    assert not matcher.accept_token(ids[0])


def test_bitmask_agrees_with_accept_token(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo
) -> None:
    matcher = factory.create(GuidedDecodingParams(json_schema=PERSON))
    feed_tokens(matcher, tokenizer.encode('{"name": "Ada", "age": 3'))
    allowed = allowed_token_ids(
        next_token_mask(matcher, tokenizer.vocab_size), tokenizer.vocab_size
    )
    generator = torch.Generator().manual_seed(0)
    probes = torch.randint(0, tokenizer.vocab_size, (300,), generator=generator).tolist()
    for token in sorted(allowed)[:200] + probes:
        accepted = matcher.accept_token(token)
        assert accepted == (token in allowed), token
        if accepted:
            matcher.rollback(1)


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance", "auto"])
def test_every_stop_token_terminates_on_every_backend(backend_name: str) -> None:
    base = TokenizerInfo.default()
    tok = TokenizerInfo(base.hf_tokenizer, stop_token_ids=[1, 2, 128000])
    config = GuidedDecodingConfig(backend=backend_name, tokenizer=tok)
    factory = create_grammar_matcher_factory(config)
    for stop in tok.stop_token_ids:
        matcher = factory.create(GuidedDecodingParams(regex="(ab)+"))
        feed_tokens(matcher, tok.encode("abab"))
        allowed = allowed_token_ids(next_token_mask(matcher, tok.vocab_size), tok.vocab_size)
        assert set(tok.stop_token_ids) <= allowed
        assert matcher.accept_token(stop)
        assert matcher.is_terminated()
        matcher.rollback(1)
        assert not matcher.is_terminated()
        assert feed_tokens(matcher, tok.encode("ab")) == 1


def test_stop_token_after_a_forced_end_counts_as_one_rollback_step(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo
) -> None:
    matcher = factory.create(GuidedDecodingParams(choice=["stop here"]))
    ids = tokenizer.encode("stop here")
    assert feed_tokens(matcher, ids) == len(ids)
    assert matcher.accept_token(tokenizer.eos_token_id)
    matcher.rollback(2)
    assert not matcher.is_terminated()
    assert feed_tokens(matcher, ids[-1:]) == 1
    assert matcher.accept_token(tokenizer.eos_token_id)


@pytest.mark.parametrize(("params", "valid", "_invalid"), GUIDE_CASES)
def test_rollback_then_replay_gives_identical_bitmask(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, params, valid: str, _invalid: str
) -> None:
    ids = [*tokenizer.encode(valid), tokenizer.eos_token_id]
    matcher = factory.create(params)
    rows = []
    for token in ids:
        rows.append(next_token_mask(matcher, tokenizer.vocab_size))
        assert matcher.accept_token(token)
    for k in range(1, len(ids) + 1):
        matcher.rollback(k)
        assert torch.equal(next_token_mask(matcher, tokenizer.vocab_size), rows[len(ids) - k]), k
        assert feed_tokens(matcher, ids[len(ids) - k :]) == k
        assert matcher.is_terminated()


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_rollbacks_match_a_fresh_matcher(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    data: st.DataObject,
) -> None:
    backend = data.draw(st.sampled_from(["xgrammar", "llguidance"]))
    factory = make_factory(backend)
    params = GuidedDecodingParams(json_schema=PERSON)
    ids = tokenizer.encode(PERSON_TEXT)
    matcher, position = factory.create(params), 0
    for _ in range(data.draw(st.integers(1, 8))):
        forward = data.draw(st.integers(0, len(ids) - position))
        assert feed_tokens(matcher, ids[position : position + forward]) == forward
        position += forward
        back = data.draw(st.integers(0, position))
        matcher.rollback(back)
        position -= back
    fresh = factory.create(params)
    feed_tokens(fresh, ids[:position])
    assert torch.equal(
        next_token_mask(matcher, tokenizer.vocab_size), next_token_mask(fresh, tokenizer.vocab_size)
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_completes_answers_as_token_by_token_and_leaves_the_state(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    data: st.DataObject,
) -> None:
    """Each backend's one-call ``completes`` (xgrammar: ``accept_string``; llguidance:
    ``try_consume_tokens``) against the base class's token-by-token loop, on completions that
    end the guide, fall short of it, break it, hold a stop token too early or a token out of
    range, from any point of a valid output; the matcher is where it was afterwards."""
    backend = data.draw(st.sampled_from(["xgrammar", "llguidance"]))
    params, valid, _invalid = data.draw(st.sampled_from(GUIDE_CASES[:5]))
    factory = make_factory(backend)
    stop = tokenizer.stop_token_ids[0]
    ids = tokenizer.encode(valid)
    start = data.draw(st.integers(0, len(ids) - 1))
    rest = [*ids[start:], stop]
    kind = data.draw(st.sampled_from(["whole", "short", "changed", "early stop", "no stop"]))
    if kind == "short":
        rest = [*rest[: data.draw(st.integers(0, len(rest) - 2))], stop]
    elif kind == "changed":
        at = data.draw(st.integers(0, len(rest) - 2))
        rest[at] = data.draw(st.sampled_from([0, 7, 96, tokenizer.vocab_size - 1, -1, 10**6]))
    elif kind == "early stop":
        rest.insert(data.draw(st.integers(0, len(rest) - 1)), stop)
    elif kind == "no stop":
        rest = rest[:-1]
    matcher = factory.create(params)
    assert feed_tokens(matcher, ids[:start]) == start
    before = next_token_mask(matcher, tokenizer.vocab_size)
    expected = GrammarMatcher.completes(matcher, rest)  # the loop, on the same matcher
    assert matcher.completes(rest) == expected
    assert expected == (kind == "whole") or kind in ("short", "changed")
    assert torch.equal(next_token_mask(matcher, tokenizer.vocab_size), before)
    assert feed_tokens(matcher, ids[start:]) == len(ids) - start  # the history is intact
    matcher.rollback(len(ids))


def test_rollback_past_the_first_token_is_a_value_error(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo
) -> None:
    matcher = factory.create(GuidedDecodingParams(regex="[a-z]+"))
    assert feed_tokens(matcher, tokenizer.encode("ab")) == 1
    with pytest.raises(ValueError, match="cannot roll back 2 tokens"):
        matcher.rollback(2)
    with pytest.raises(ValueError, match="cannot roll back -1"):
        matcher.rollback(-1)
    matcher.rollback(1)
    assert feed_tokens(matcher, tokenizer.encode("ab")) == 1


def test_stop_tokens_never_match_their_text(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo
) -> None:
    matcher = factory.create(GuidedDecodingParams(json_schema={"type": "string"}))
    prefix = tokenizer.encode('"a')
    assert feed_tokens(matcher, prefix) == len(prefix)
    assert not matcher.accept_token(tokenizer.eos_token_id)  # not as '<｜end▁of▁sentence｜>'
    assert not factory.create(GuidedDecodingParams(regex=".+")).accept_token(tokenizer.eos_token_id)


def test_llguidance_fill_refuses_a_bitmask_it_would_write_out_of(
    make_factory, tokenizer: TokenizerInfo
) -> None:
    matcher = make_factory("llguidance").create(GuidedDecodingParams(regex="a+"))
    words = bitmask_size(tokenizer.vocab_size)
    with pytest.raises(ValueError, match="int32"):
        matcher.fill_next_token_bitmask(torch.zeros(1, words, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match="words per row"):
        matcher.fill_next_token_bitmask(torch.zeros(1, words - 1, dtype=torch.int32), 0)
    with pytest.raises(IndexError, match="out of range"):
        matcher.fill_next_token_bitmask(allocate_bitmask(2, tokenizer.vocab_size), 2)


def test_xgrammar_wrapper_calls_the_native_handle_and_falls_back_to_the_public_methods(
    tokenizer: TokenizerInfo,
) -> None:
    """The wrapper's hot calls go to xgrammar's native handle, under its Python methods; a
    matcher without such a handle, or of a subclass (which may override a method), goes through
    the public methods, with the same results."""
    import xgrammar

    from guidedec.grammar.xgrammar_backend import XGrammarMatcher, _native_calls, _PublicCalls
    from guidedec.grammar.xgrammar_tokenizer import xgrammar_tokenizer_info

    compiled = xgrammar.GrammarCompiler(xgrammar_tokenizer_info(tokenizer)).compile_json_schema(
        json.dumps(PERSON)
    )

    class Subclassed(xgrammar.GrammarMatcher):
        pass

    stops = frozenset(tokenizer.stop_token_ids)
    native = XGrammarMatcher(xgrammar.GrammarMatcher(compiled), stops)
    assert native._native is native._matcher._handle
    public = XGrammarMatcher(Subclassed(compiled), stops)
    assert isinstance(public._native, _PublicCalls)
    assert isinstance(_native_calls(object()), _PublicCalls)  # type: ignore[arg-type]
    ids = tokenizer.encode(PERSON_TEXT)
    for position, token in enumerate(ids):
        assert torch.equal(
            next_token_mask(native, tokenizer.vocab_size),
            next_token_mask(public, tokenizer.vocab_size),
        ), position
        assert native.accept_token(token) and public.accept_token(token)
        if position % 3 == 2:
            native.rollback(2)
            public.rollback(2)
            assert feed_tokens(native, ids[position - 1 : position + 1]) == 2
            assert feed_tokens(public, ids[position - 1 : position + 1]) == 2
    assert not native.accept_token(ids[0]) and not public.accept_token(ids[0])
