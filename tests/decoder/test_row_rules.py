"""Row rules follow their matcher exactly: through accepts, rollbacks and fills of every kind,
a ruled matcher's rows are those of fresh rules told exactly the accepted tokens.

Oracle: a fresh matcher with fresh rules, fed the accepted tokens one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import GuidedDecodingParams, TokenizerInfo
from guidedec.bitmask import allocate_bitmask
from guidedec.decoder.closing import DigitTokens
from guidedec.decoder.row_rules import MAX_DIGIT_RUN, DigitRunRule, RootTypeRule, RowRules
from guidedec.errors import MatcherError
from guidedec.grammar.batch_fill import BatchFiller
from guidedec.grammar.matcher import GrammarMatcher, GrammarMatcherFactory, WrappedMatcher
from guidedec.grammar.ruled import RuledMatcher
from guidedec.testing import allowed_token_ids

# xgrammar guides an allOf beside "type" as any JSON value: the root-type rule restricts the
# first rows to an object's start, and under closing the digit rule cuts a long number.
ANY_OBJECT = {
    "type": "object",
    "allOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["a"]}],
}
SCRIPT = '{"a": ' + "1234567890" * 4 + "}"


@pytest.fixture(scope="module")
def ruled(
    tokenizer: TokenizerInfo, make_factory: Callable[..., GrammarMatcherFactory]
) -> Callable[[], GrammarMatcher]:
    factory = make_factory("xgrammar")
    rules = RowRules(tokenizer)
    params = GuidedDecodingParams(json_schema=ANY_OBJECT)
    return lambda: rules.wrap(factory.create(params), params, closing=True)


def _row(matcher: GrammarMatcher, tokenizer: TokenizerInfo) -> torch.Tensor:
    bitmask = allocate_bitmask(1, tokenizer.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0]


def test_the_rules_of_a_json_guide_under_xgrammar(tokenizer: TokenizerInfo) -> None:
    rules = RowRules(tokenizer)
    schema = GuidedDecodingParams(json_schema=ANY_OBJECT)
    kinds = [type(rule) for rule in rules.rules(schema, "xgrammar", closing=True)]
    assert kinds == [RootTypeRule, DigitRunRule]
    assert [type(r) for r in rules.rules(schema, "llguidance", closing=True)] == [DigitRunRule]
    assert rules.rules(schema, "llguidance", closing=False) == []
    assert rules.rules(GuidedDecodingParams(regex="[0-9]+"), "xgrammar", closing=True) == []
    json_object = GuidedDecodingParams(json_object=True)
    assert [type(r) for r in rules.rules(json_object, "xgrammar", closing=True)] == [DigitRunRule]


def test_the_ruled_rows_cut_the_root_and_the_digit_run(
    ruled: Callable[[], GrammarMatcher], tokenizer: TokenizerInfo
) -> None:
    matcher = ruled()
    assert isinstance(matcher, RuledMatcher)
    (digit,) = tokenizer.encode("7")
    (quote,) = tokenizer.encode('"')
    first = allowed_token_ids(_row(matcher, tokenizer), tokenizer.vocab_size)
    assert digit not in first and quote not in first  # the root is an object
    assert tokenizer.encode("{")[0] in first
    tokens = tokenizer.encode(SCRIPT)
    written = ""
    for token in tokens:
        if len(written.rsplit(" ", 1)[-1]) >= MAX_DIGIT_RUN:
            break
        assert matcher.accept_token(token)
        written += tokenizer.decode([token])
    allowed = allowed_token_ids(_row(matcher, tokenizer), tokenizer.vocab_size)
    digits = DigitTokens.of(tokenizer).lengths
    assert not any(digits[t] for t in allowed)  # no all-digit token after the run
    assert tokenizer.encode("}")[0] in allowed


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 4), min_size=1, max_size=40))
def test_rules_follow_the_matcher_through_accepts_and_rollbacks(
    ruled: Callable[[], GrammarMatcher], tokenizer: TokenizerInfo, moves: list[int]
) -> None:
    """Each move accepts the script's next few tokens (positive) or rolls back a few
    (negative); after each, the row is that of a fresh ruled matcher fed the accepted ones."""
    tokens = tokenizer.encode(SCRIPT)
    matcher, accepted = ruled(), 0
    for move in moves:
        if move >= 0:
            take = min(move, len(tokens) - accepted)
            for token in tokens[accepted : accepted + take]:
                assert matcher.advance(token) if move % 2 else matcher.accept_token(token)
            accepted += take
        else:
            back = min(-move, accepted)
            matcher.rollback(back)
            accepted -= back
        fresh = ruled()
        for token in tokens[:accepted]:
            assert fresh.accept_token(token)
        assert torch.equal(_row(matcher, tokenizer), _row(fresh, tokenizer)), (moves, accepted)


def test_advance_and_fill_and_batch_fills_give_the_ruled_row(
    ruled: Callable[[], GrammarMatcher], tokenizer: TokenizerInfo
) -> None:
    """The decoder's fused advance-and-fill, and a parallel batch fill of the backend's
    matchers, restrict the row as a plain fill does."""
    tokens = tokenizer.encode(SCRIPT)
    for stop in (0, 3, len(tokens) - 2):
        fused, plain = ruled(), ruled()
        for token in tokens[:stop]:
            assert plain.accept_token(token) and fused.accept_token(token)
        bitmask = allocate_bitmask(1, tokenizer.vocab_size)
        fused.advance_and_fill(tokens[stop], bitmask, 0)
        assert plain.accept_token(tokens[stop])
        assert torch.equal(bitmask[0], _row(plain, tokenizer))
    matchers = [ruled() for _ in range(6)]
    for n, matcher in enumerate(matchers):  # at six points of the script
        for token in tokens[: 2 * n]:
            assert matcher.accept_token(token)
    batch = allocate_bitmask(6, tokenizer.vocab_size)
    filler = BatchFiller("parallel", 2)
    assert filler.fill(matchers, batch, list(range(6))) == [None] * 6
    for n, matcher in enumerate(matchers):
        assert torch.equal(batch[n], _row(matcher, tokenizer)), n


class _RaisingBatch(WrappedMatcher):
    """A backend whose batch call raises for the whole batch (one row of it failed)."""

    parallel_fill = True

    @classmethod
    def fill_next_token_bitmasks(cls, *args: Any, **kwargs: Any) -> list[Exception | None]:
        raise MatcherError("the batch call failed")


class _FailingFill(_RaisingBatch):
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        raise MatcherError("this row failed")


def test_a_batch_call_that_raises_is_filled_one_by_one(
    tokenizer: TokenizerInfo, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    """A backend's batch call raising for the whole batch fails no request by itself: the
    rows are filled one by one, and only the matcher that fails there is reported."""
    factory = make_factory("xgrammar")
    params = GuidedDecodingParams(regex="[a-z]+")
    matchers: list[GrammarMatcher] = [_RaisingBatch(factory.create(params)) for _ in range(4)]
    matchers[2] = _FailingFill(factory.create(params))
    bitmask = allocate_bitmask(4, tokenizer.vocab_size).zero_()
    errors = BatchFiller("parallel", 2).fill(matchers, bitmask, [0, 1, 2, 3])
    assert [e is None for e in errors] == [True, True, False, True]
    assert "this row failed" in str(errors[2])
    expected = _row(factory.create(params), tokenizer)
    for row in (0, 1, 3):
        assert torch.equal(bitmask[row], expected)


def test_a_row_the_digit_rule_would_empty_is_left_as_it_was(tokenizer: TokenizerInfo) -> None:
    """A guide that allows only digits after a long run (a string pattern of digits) keeps
    its row: the rule never leaves a row with nothing allowed."""
    rules = RowRules(tokenizer)
    json_digits = GuidedDecodingParams(json_schema={"type": "string", "pattern": "^[0-9]{40}$"})
    (rule,) = rules.rules(json_digits, "llguidance", closing=True)
    for token in tokenizer.encode("1" * 30):
        rule.advance(token)
    assert rule.active()
    digits = DigitTokens.of(tokenizer)
    only_digits = digits.words.copy()
    rule.restrict(only_digits)
    assert np.array_equal(only_digits, digits.words)
    assert rules.stats.digit_runs_cut == 0
