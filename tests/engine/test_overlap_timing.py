"""The overlap scheduler's timing rules: a request can reach a build after its matcher has
already accepted a stop token (inside the drafts verified at the previous iteration, or at an
earlier step of a drafting loop), or after its matcher failed to be created. Advancing skips
those cases without error and without masking, and the request finishes at this iteration."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from guidedec import (
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingParams,
    GuidedRequest,
    TokenizerInfo,
)
from guidedec.testing import feed_tokens, make_decoder, next_token_mask

REGEX = GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,2}")


@pytest.fixture(params=["xgrammar", "llguidance"])
def decoder(
    request: pytest.FixtureRequest,
    tokenizer: TokenizerInfo,
    make_factory: Callable[..., GrammarMatcherFactory],
) -> GuidedDecoder:
    decoder = make_decoder(
        tokenizer,
        request.param,
        factory=make_factory(request.param),
        max_num_sequences=2,
        max_num_draft_tokens=4,
    )
    decoder.add_batch([GuidedRequest.context(REGEX, request_id=1, seq_slot=0)])
    assert decoder.execute(torch.zeros(1, tokenizer.vocab_size)) == []
    return decoder


def masked_step(decoder: GuidedDecoder, request: GuidedRequest) -> tuple[list, torch.Tensor]:
    decoder.add_batch([request])
    assert decoder.requests is not None
    logits = torch.randn(decoder.requests.num_bitmask_tokens, decoder.vocab_size)
    return decoder.execute(logits), logits


def test_stop_token_accepted_inside_the_drafts_at_the_previous_iteration(
    decoder: GuidedDecoder, tokenizer: TokenizerInfo
) -> None:
    yes = tokenizer.encode("yes-7")
    eos = tokenizer.eos_token_id
    drafts = [*yes[1:], eos, yes[0]]  # the stop token, then a draft past it
    verify = GuidedRequest.generation(
        REGEX, request_id=1, seq_slot=0, new_token=yes[0], draft_tokens=drafts[:4]
    )
    failures, _ = masked_step(decoder, verify)
    assert failures == []
    matcher = decoder.grammar_matchers[0]
    assert matcher is not None and matcher.is_terminated()
    # Verification accepted every draft, past the stop token the matcher stopped at.
    assert decoder.rollback_rejected_batch([1 + 4]) == []
    assert matcher.is_terminated()
    # An overlap scheduler has already scheduled the request once more, with the bonus token.
    again = GuidedRequest.generation(REGEX, request_id=1, seq_slot=0, new_token=yes[0])
    failures, logits = masked_step(decoder, again)
    assert failures == []  # no "token rejected" failure: the request just finishes
    assert decoder.token_mask_host[0] == 0  # nothing masked
    assert torch.isfinite(logits).all()
    assert decoder.num_advanced_tokens[0] == 0
    assert decoder.rollback_rejected_batch([1]) == []  # and nothing to roll back


def test_stop_token_accepted_at_an_earlier_drafting_step(
    decoder: GuidedDecoder, tokenizer: TokenizerInfo
) -> None:
    yes = tokenizer.encode("yes-7")  # three tokens
    eos = tokenizer.eos_token_id
    verify = GuidedRequest.generation(
        REGEX, request_id=1, seq_slot=0, new_token=yes[0], draft_tokens=yes[1:]
    )
    decoder.add_batch([verify], num_draft_tokens=3)
    assert decoder.requests is not None
    assert (
        decoder.execute(torch.randn(decoder.requests.num_bitmask_tokens, tokenizer.vocab_size))
        == []
    )
    # Verification accepts both drafts; the drafting loop (3 steps) starts from the bonus token,
    # here the stop token: the matcher accepts it at step 0 and is terminated from then on.
    matcher = decoder.grammar_matchers[0]
    assert matcher is not None
    for step, token in enumerate([eos, yes[0], yes[1]]):
        decoder.add_draft_batch([token], [3] if step == 0 else None, draft_step=step)
        logits = torch.randn(1, tokenizer.vocab_size)
        assert decoder.execute_draft_batch(logits, draft_step=step) == []
        assert decoder.token_mask_host[0] == 0  # terminated: nothing to mask
        assert torch.isfinite(logits).all()
        if step < 2:
            assert matcher.is_terminated()
    # The loop's last step rolled back every draft advance: the accepted prefix "yes-7".
    assert not matcher.is_terminated()
    assert decoder.num_advanced_draft_tokens[0] == 0 and not decoder.is_draft_terminated[0]
    fresh = decoder.factory.create(REGEX)
    assert feed_tokens(fresh, yes) == 3
    vocab = tokenizer.vocab_size
    assert torch.equal(next_token_mask(matcher, vocab), next_token_mask(fresh, vocab))


def test_matcher_missing_after_a_failed_creation(
    decoder: GuidedDecoder, tokenizer: TokenizerInfo
) -> None:
    bad = GuidedDecodingParams(regex="(unclosed")
    decoder.add_batch([GuidedRequest.context(bad, request_id=2, seq_slot=1)])
    failures = dict(decoder.execute(torch.zeros(1, decoder.vocab_size)))
    assert set(failures) == {2}
    # Scheduled once more before the engine saw the failure: it is reported again (so the
    # request finishes at this iteration), never run unguided, and its logits stay finite.
    again = GuidedRequest.generation(bad, request_id=2, seq_slot=1, new_token=5)
    failures_again, logits = masked_step(decoder, again)
    assert [request_id for request_id, _ in failures_again] == [2]
    assert torch.isfinite(logits).all()
