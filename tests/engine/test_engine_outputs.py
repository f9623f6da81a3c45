"""What ``LLM`` reports beside the tokens: stop strings and log-probabilities (float64, the
model's own forward as the oracle)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bitmask import allocate_bitmask
from guidedec.engine.stop_strings import stop_string_start
from guidedec.grammar.matcher import GrammarMatcher

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    engine = LLM("tiny-random", max_num_seqs=4, dtype="float64", json_whitespace="compact")
    yield engine
    engine.close()


def test_a_stop_string_cuts_the_text_and_keeps_the_tokens(llm: LLM) -> None:
    free = llm.generate(["Once"], SamplingParams(max_tokens=20))[0]
    stop = free.text[9:12]
    assert stop not in free.text[:9]
    cut = llm.generate(["Once"], SamplingParams(max_tokens=20, stop=[stop, "zzzz"]))[0]
    assert cut.text == free.text[: free.text.index(stop)]
    assert cut.finish_reason == "stop" and cut.incomplete is None
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    assert stop in llm.tokenizer.decode(cut.token_ids)  # the token that completed it is kept
    assert stop not in llm.tokenizer.decode(cut.token_ids[:-1])


def test_a_stop_string_inside_a_guided_output_says_it_was_not_checked(llm: LLM) -> None:
    guide = GuidedDecodingParams(json_schema=PERSON)
    whole = llm.generate(["x"], SamplingParams(max_tokens=40, guided_decoding=guide))[0]
    assert whole.finish_reason == "stop" and whole.incomplete is None
    cut = llm.generate(["x"], SamplingParams(max_tokens=40, guided_decoding=guide, stop='"age"'))
    assert cut[0].text == whole.text[: whole.text.index('"age"')]
    assert cut[0].incomplete is not None and "stop string" in cut[0].incomplete


@pytest.mark.parametrize("bad", ["", [""], [1], ["a"] * 33, ["a" * 1025]])
def test_bad_stop_strings_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=bad)  # type: ignore[arg-type]


def test_a_lone_byte_inside_the_text_separates_what_it_is_between() -> None:
    """Token 97 is one byte of a multi-byte character: decoded, it is a U+FFFD that stays in the
    text, so ``' //'``, that byte and ``' //'`` never make ``' // '``; ``' we'`` after them does."""
    from guidedec.tokenizer import TokenizerInfo

    tokenizer = TokenizerInfo.default()
    ids = [3, 3, 3, 3, 3, 3, 3, 259, 425, 475, 1585, 1915, 97, 1915, 579]
    hits = [stop_string_start(tokenizer, ids[:n], [" // "]) for n in range(1, len(ids) + 1)]
    text = tokenizer.decode(ids)
    assert hits == [None] * (len(ids) - 1) + [text.index(" // ")]
    assert "\ufffd // " in text


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2000), min_size=1, max_size=30), st.data())
def test_the_tail_check_finds_what_a_full_scan_finds(ids: list[int], data: st.DataObject) -> None:
    """Token by token, the tail check reports a stop string exactly when the decoded text first
    contains it, and at the same place."""
    from guidedec.tokenizer import TokenizerInfo

    tokenizer = TokenizerInfo.default()
    text = tokenizer.decode(ids)
    start = data.draw(st.integers(0, max(0, len(text) - 1)))
    stop = text[start : start + data.draw(st.integers(1, 6))] or "x"
    for n in range(1, len(ids) + 1):
        found = stop_string_start(tokenizer, ids[:n], [stop])
        prefix = tokenizer.decode(ids[:n])
        if found is not None:
            assert found == prefix.index(stop)
            break
        # A trailing U+FFFD is a character still incomplete (its bytes may come with the next
        # token); one inside the text is a real one, and stays between what it separates.
        assert stop not in prefix.rstrip("\ufffd")


def allowed_tokens(matcher: GrammarMatcher, vocab_size: int) -> list[int]:
    bitmask = allocate_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    words = bitmask[0].tolist()
    return [t for t in range(vocab_size) if (words[t >> 5] >> (t & 31)) & 1]


def _oracle_logprobs(llm: LLM, prompt_ids: list[int], output: list[int]) -> torch.Tensor:
    """log_softmax of the model's own logits at each output position (no engine involved)."""
    ids = torch.tensor([prompt_ids + output])
    with torch.no_grad():
        logits = llm.model.model(input_ids=ids).logits[0].double()
    return torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)


def test_logprobs_of_unguided_tokens_are_the_models(llm: LLM) -> None:
    out = llm.generate(["Hello there"], SamplingParams(max_tokens=6, logprobs=3))[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    oracle = _oracle_logprobs(llm, out.prompt_token_ids, out.token_ids)
    for k, entry in enumerate(out.logprobs):
        assert entry.token_id == out.token_ids[k]
        assert entry.logprob == pytest.approx(float(oracle[k, entry.token_id]), abs=1e-9)
        best = oracle[k].topk(3)
        assert [i for i, _ in entry.top] == best.indices.tolist()  # greedy: the first is it
        assert entry.top[0][0] == entry.token_id


def test_logprobs_under_a_guide_come_from_the_masked_row(llm: LLM) -> None:
    """softmax(logits / T) over the row's allowed tokens alone; a forbidden token has none."""
    guide = GuidedDecodingParams(choice=["yes please", "no thanks"])
    params = SamplingParams(
        max_tokens=8, temperature=0.7, seed=3, logprobs=20, guided_decoding=guide
    )
    out = llm.generate(["Pick"], params)[0]
    assert out.text in ("yes please", "no thanks") and out.logprobs is not None
    oracle = _oracle_logprobs(llm, out.prompt_token_ids, out.token_ids)
    matcher = llm.factory.create(guide)
    for k, entry in enumerate(out.logprobs):
        mask = allowed_tokens(matcher, llm.tokenizer.vocab_size)
        assert len(mask) < 20 and sorted(i for i, _ in entry.top) == sorted(mask)
        expected = torch.log_softmax(oracle[k, mask] / 0.7, dim=-1)
        assert entry.logprob == pytest.approx(float(expected[mask.index(entry.token_id)]), abs=1e-9)
        assert sum(math.exp(lp) for _, lp in entry.top) == pytest.approx(1.0, abs=1e-9)
        assert matcher.accept_token(entry.token_id)


def test_logprobs_are_off_by_default_and_bounded(llm: LLM) -> None:
    assert llm.generate(["x"], SamplingParams(max_tokens=2))[0].logprobs is None
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
