"""GuidedDecoder's speculative accounting: rollbacks, draft-termination paths, bad counts,
runtime draft length, generation-only requests, and misuse of the drafting-loop API."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from guidedec import (
    GrammarMatcher,
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingParams,
    GuidedRequest,
    TokenizerInfo,
)
from guidedec.decoder import GuidedRequests
from guidedec.testing import bitmask_to_bool_mask, feed_tokens, make_decoder, next_token_mask

REGEX = GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,4}!")
OTHER = GuidedDecodingParams(choice=["alpha", "beta"])


def make(
    tokenizer: TokenizerInfo,
    factory: GrammarMatcherFactory,
    *,
    drafts: int = 3,
    slots: int = 2,
) -> GuidedDecoder:
    return make_decoder(
        tokenizer, factory=factory, max_num_sequences=slots, max_num_draft_tokens=drafts
    )


def logits_for(decoder: GuidedDecoder) -> torch.Tensor:
    assert decoder.requests is not None
    return torch.zeros(decoder.requests.num_bitmask_tokens, decoder.vocab_size)


def step(decoder: GuidedDecoder, requests: list[GuidedRequest]) -> list[tuple[int, str]]:
    decoder.add_batch(requests)
    return decoder.execute(logits_for(decoder))


def same_state(decoder, slot, factory, params, tokens, vocab) -> bool:
    fresh = factory.create(params)
    assert feed_tokens(fresh, tokens) == len(tokens)
    matcher = decoder.grammar_matchers[slot]
    return torch.equal(next_token_mask(matcher, vocab), next_token_mask(fresh, vocab))


@pytest.fixture(params=["xgrammar", "llguidance"])
def setup(request, tokenizer: TokenizerInfo, make_factory: Callable[..., GrammarMatcherFactory]):
    factory = make_factory(request.param)
    decoder = make(tokenizer, factory)
    yes_tokens = tokenizer.encode("yes-12!")
    alpha = tokenizer.encode("alpha")
    step(
        decoder,
        [
            GuidedRequest.context(REGEX, request_id=1, seq_slot=0),
            GuidedRequest.context(OTHER, request_id=2, seq_slot=1),
        ],
    )
    return decoder, factory, yes_tokens, alpha


def verify_step(decoder, yes_tokens, alpha, drafts):
    """Request 1 feeds its first token plus ``drafts``; request 2 feeds its first token."""
    return step(
        decoder,
        [
            GuidedRequest.generation(
                REGEX, request_id=1, seq_slot=0, new_token=yes_tokens[0], draft_tokens=drafts
            ),
            GuidedRequest.generation(OTHER, request_id=2, seq_slot=1, new_token=alpha[0]),
        ],
    )


def test_rollback_restores_the_accepted_prefix(setup, tokenizer) -> None:
    decoder, factory, yes, alpha = setup
    assert verify_step(decoder, yes, alpha, yes[1:4]) == []
    assert decoder.num_advanced_tokens[0] == 4
    assert decoder.rollback_rejected_batch([2, 1]) == []  # new token + 1 draft accepted
    vocab = tokenizer.vocab_size
    assert same_state(decoder, 0, factory, REGEX, yes[:2], vocab)
    assert same_state(decoder, 1, factory, OTHER, alpha[:1], vocab)
    # A second rollback before the next build does nothing.
    assert decoder.rollback_rejected_batch([1, 1]) == []
    assert same_state(decoder, 0, factory, REGEX, yes[:2], vocab)


def test_an_impossible_accepted_count_fails_only_its_request(setup, tokenizer) -> None:
    decoder, factory, yes, alpha = setup
    assert verify_step(decoder, yes, alpha, yes[1:3]) == []
    failures = decoder.rollback_rejected_batch([5, 1])  # 4 drafts accepted out of 2
    assert [f[0] for f in failures] == [1]
    assert "rollback would be negative" in failures[0][1] and "request 1" in failures[0][1]
    assert decoder.grammar_matchers[0] is None
    assert same_state(decoder, 1, factory, OTHER, alpha[:1], tokenizer.vocab_size)
    # The failed request, if scheduled again, keeps failing instead of running unguided.
    again = GuidedRequest.generation(REGEX, request_id=1, seq_slot=0, new_token=yes[0])
    failures = step(decoder, [again])
    assert [f[0] for f in failures] == [1] and "no grammar matcher" in failures[0][1]


def test_a_count_that_undoes_the_new_token_fails(setup) -> None:
    decoder, _, yes, alpha = setup
    assert verify_step(decoder, yes, alpha, yes[1:3]) == []
    failures = decoder.rollback_rejected_batch([0, 1])
    assert [f[0] for f in failures] == [1]


def test_accepting_a_draft_token_the_grammar_rejected_fails(setup, tokenizer) -> None:
    decoder, _, yes, alpha = setup
    bogus = tokenizer.encode("zzz")[0]
    assert verify_step(decoder, yes, alpha, [yes[1], bogus, yes[2]]) == []
    assert decoder.num_advanced_tokens[0] == 2  # guiding stopped at the rejected draft
    assert decoder.token_mask_host[:4].tolist() == [1, 1, 0, 0]
    failures = decoder.rollback_rejected_batch([3, 1])  # claims `bogus` was accepted
    assert [f[0] for f in failures] == [1]


def test_a_stop_token_inside_the_drafts_clamps_the_accepted_count(setup, tokenizer) -> None:
    decoder, _, yes, _ = setup
    eos = tokenizer.eos_token_id
    drafts = [*yes[1:], eos, 123]
    decoder = make(tokenizer, decoder.factory, drafts=len(drafts))
    step(decoder, [GuidedRequest.context(REGEX, request_id=1, seq_slot=0)])
    step(
        decoder,
        [
            GuidedRequest.generation(
                REGEX, request_id=1, seq_slot=0, new_token=yes[0], draft_tokens=drafts
            )
        ],
    )
    assert decoder.num_advanced_tokens[0] == len(yes) + 1  # through the stop token, not past it
    matcher = decoder.grammar_matchers[0]
    assert matcher is not None and matcher.is_terminated()
    # Verification accepted every draft, including the token after the stop token.
    assert decoder.rollback_rejected_batch([1 + len(drafts)]) == []
    assert matcher.is_terminated()


class ScriptedMatcher(GrammarMatcher):
    """Accepts every token but those in ``reject``; the state after a token in ``dead`` allows
    nothing. Records its history so tests can see what was rolled back."""

    def __init__(self, reject: set[int], dead: set[int], fail_rollback: bool = False) -> None:
        self.reject, self.dead, self.fail_rollback = reject, dead, fail_rollback
        self.history: list[int] = []

    def accept_token(self, token_id: int) -> bool:
        if token_id in self.reject:
            return False
        self.history.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        if self.fail_rollback:
            raise RuntimeError("backend refused to roll back")
        assert 0 <= num_tokens <= len(self.history)
        del self.history[len(self.history) - num_tokens :]

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        bitmask[index].fill_(0 if self.history and self.history[-1] in self.dead else -1)

    def is_terminated(self) -> bool:
        return False


class ScriptedFactory(GrammarMatcherFactory):
    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.made: list[ScriptedMatcher] = []

    def compile(self, params: GuidedDecodingParams) -> object:
        return params

    def create(self, params: GuidedDecodingParams) -> ScriptedMatcher:
        self.made.append(ScriptedMatcher(**self.kwargs))
        return self.made[-1]


def start_drafting(decoder: GuidedDecoder, new_token: int, *, drafts=(), accepted=1):
    """A context step, a verification step with ``drafts``, then draft step 0 with ``new_token``
    as the bonus token. Returns the failures of the draft step."""
    step(decoder, [GuidedRequest.context(REGEX, request_id=9, seq_slot=0)])
    step(
        decoder,
        [
            GuidedRequest.generation(
                REGEX, request_id=9, seq_slot=0, new_token=10, draft_tokens=drafts
            )
        ],
    )
    decoder.add_draft_batch([new_token], [accepted], draft_step=0)
    return decoder.execute_draft_batch(torch.zeros(1, decoder.vocab_size), draft_step=0)


def scripted(tokenizer, drafts=3, **kwargs) -> tuple[GuidedDecoder, ScriptedFactory]:
    factory = ScriptedFactory(**kwargs)
    return make(tokenizer, factory, drafts=drafts, slots=1), factory


def test_draft_path_1_a_rejected_new_token_stops_guiding_without_advancing(tokenizer) -> None:
    decoder, factory = scripted(tokenizer, reject={66}, dead=set())
    assert start_drafting(decoder, 66) == []
    assert decoder.is_draft_terminated[0]
    assert decoder.num_advanced_draft_tokens[0] == 0
    assert decoder.token_mask_host[0] == 0
    assert factory.made[0].history == [10]


def test_draft_path_2_a_dead_end_row_stops_guiding_but_its_advance_is_rolled_back(
    tokenizer,
) -> None:
    decoder, factory = scripted(tokenizer, reject=set(), dead={77})
    assert start_drafting(decoder, 77) == []
    assert decoder.is_draft_terminated[0] and decoder.num_advanced_draft_tokens[0] == 1
    assert decoder.token_mask_host[0] == 0  # the dead-end row is never applied
    assert factory.made[0].history == [10, 77]
    decoder.add_draft_batch([5], draft_step=1)
    assert decoder.execute_draft_batch(torch.zeros(1, decoder.vocab_size), draft_step=1) == []
    assert factory.made[0].history == [10, 77]  # guiding stays stopped for the loop
    decoder.add_draft_batch([6], draft_step=2)
    decoder.execute_draft_batch(torch.zeros(1, decoder.vocab_size), draft_step=2)
    # The last draft step rolls back the drafting loop's advances and resets its state.
    assert factory.made[0].history == [10]
    assert not decoder.is_draft_terminated[0] and decoder.num_advanced_draft_tokens[0] == 0


def test_draft_path_3_a_rejected_draft_token_stops_the_rows_not_the_loop(tokenizer) -> None:
    decoder, factory = scripted(tokenizer, reject={55}, dead=set())
    step(decoder, [GuidedRequest.context(REGEX, request_id=9, seq_slot=0)])
    step(
        decoder,
        [
            GuidedRequest.generation(
                REGEX, request_id=9, seq_slot=0, new_token=10, draft_tokens=[11, 55, 12]
            )
        ],
    )
    assert decoder.num_advanced_tokens[0] == 2 and decoder.num_guided_tokens[0] == 2
    assert not decoder.is_draft_terminated[0]
    assert decoder.token_mask_host[:4].tolist() == [1, 1, 0, 0]
    assert factory.made[0].history == [10, 11]


def test_a_full_drafting_loop_leaves_the_matcher_at_the_accepted_prefix(tokenizer) -> None:
    decoder, factory = scripted(tokenizer, reject=set(), dead=set())
    assert start_drafting(decoder, 40, drafts=[20, 21, 22], accepted=2) == []
    # Step 0 rolled back the rejected drafts 21, 22, then advanced the bonus token 40.
    assert factory.made[0].history == [10, 20, 40]
    for draft_step, token in enumerate([41, 42], 1):
        decoder.add_draft_batch([token], draft_step=draft_step)
        logits = torch.zeros(1, decoder.vocab_size)
        assert decoder.execute_draft_batch(logits, draft_step=draft_step) == []
    assert factory.made[0].history == [10, 20]
    assert decoder.requests is not None and decoder.requests.requests[0].is_draft


def test_a_backend_rollback_error_is_that_requests_failure(tokenizer) -> None:
    decoder, _ = scripted(tokenizer, reject=set(), dead=set(), fail_rollback=True)
    step(decoder, [GuidedRequest.context(REGEX, request_id=9, seq_slot=0)])
    step(
        decoder,
        [
            GuidedRequest.generation(
                REGEX, request_id=9, seq_slot=0, new_token=10, draft_tokens=[1, 2]
            )
        ],
    )
    failures = decoder.rollback_rejected_batch([1])
    assert failures and failures[0][0] == 9 and "refused to roll back" in failures[0][1]
    assert decoder.grammar_matchers[0] is None


def test_a_runtime_draft_length_uses_only_that_many_rows(tokenizer) -> None:
    decoder, factory = scripted(tokenizer, drafts=4, reject=set(), dead=set())
    step(decoder, [GuidedRequest.context(REGEX, request_id=9, seq_slot=0)])
    request = GuidedRequest.generation(
        REGEX, request_id=9, seq_slot=0, new_token=10, draft_tokens=[1, 2, 3, 4]
    )
    decoder.add_batch([request], num_draft_tokens=2)
    assert decoder.requests is not None and decoder.requests.num_bitmask_tokens == 3
    assert decoder.execute(torch.zeros(3, decoder.vocab_size)) == []
    assert factory.made[0].history == [10, 1, 2]
    with pytest.raises(ValueError, match="num_draft_tokens"):
        decoder.add_batch([request], num_draft_tokens=5)


def test_row_layout_of_target_and_draft_requests() -> None:
    target = GuidedRequest.generation(REGEX, request_id=1, seq_slot=0, new_token=1)
    with_drafts = GuidedRequest.generation(
        REGEX, request_id=2, seq_slot=1, new_token=1, draft_tokens=[5, 6, 7]
    )
    batch = GuidedRequests([with_drafts, target, with_drafts.as_draft(9)], num_draft_tokens=2)
    assert batch.offsets == [0, 3, 4] and batch.num_bitmask_tokens == 5


def test_generation_only_requests_get_their_matcher_in_their_first_step(
    tokenizer, make_factory
) -> None:
    factory = make_factory("xgrammar")
    decoder = make(tokenizer, factory, slots=2)
    yes = tokenizer.encode("yes-12!")
    first = GuidedRequest.generation(
        REGEX, request_id=3, seq_slot=1, new_token=yes[0], is_generation_only_first_iteration=True
    )
    # Without speculation, build creates it.
    assert step(decoder, [first]) == []
    assert same_state(decoder, 1, factory, REGEX, yes[:1], tokenizer.vocab_size)
    # With a drafting loop before the target build, init_disagg_gen_requests creates it first.
    decoder.add_batch([first])
    assert decoder.init_disagg_gen_requests() == []
    matcher = decoder.grammar_matchers[1]
    draft = first.as_draft(yes[0])
    assert step(decoder, [draft]) == [] and decoder.num_advanced_draft_tokens[1] == 1
    assert decoder.rollback_draft_tokens() == []
    request = GuidedRequest.generation(
        REGEX,
        request_id=3,
        seq_slot=1,
        new_token=yes[0],
        draft_tokens=yes[1:3],
        is_generation_only_first_iteration=True,
    )
    assert step(decoder, [request]) == []
    assert decoder.grammar_matchers[1] is matcher  # not created twice
    assert decoder.num_advanced_tokens[1] == 3


def test_a_generation_only_compile_error_is_reported_once(tokenizer, make_factory) -> None:
    decoder = make(tokenizer, make_factory("xgrammar"))
    bad = GuidedRequest.generation(
        GuidedDecodingParams(regex="(unclosed"),
        request_id=4,
        seq_slot=0,
        new_token=5,
        is_generation_only_first_iteration=True,
    )
    decoder.add_batch([bad])
    failures = decoder.init_disagg_gen_requests()
    assert [f[0] for f in failures] == [4]
    logits = torch.zeros(1, decoder.vocab_size)
    assert decoder.execute(logits) == []  # already reported; its row stays unmasked
    assert not torch.isinf(logits).any()


def test_drafting_loop_misuse_is_a_clear_error(tokenizer) -> None:
    decoder, _ = scripted(tokenizer, reject=set(), dead=set())
    step(decoder, [GuidedRequest.context(REGEX, request_id=9, seq_slot=0)])
    logits = torch.zeros(1, decoder.vocab_size)
    with pytest.raises(ValueError, match="add_draft_batch"):
        decoder.execute_draft_batch(logits, draft_step=0)
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        decoder.add_draft_batch([1], draft_step=0)
    with pytest.raises(ValueError, match="new_tokens has 2 entries"):
        decoder.add_draft_batch([1, 2], [1], draft_step=0)
    decoder.add_draft_batch([1], draft_step=1)
    with pytest.raises(ValueError, match="must follow draft_step 0"):
        decoder.execute_draft_batch(logits, draft_step=1)
    decoder.add_draft_batch([1], draft_step=3)
    with pytest.raises(ValueError, match="outside this batch's drafting loop"):
        decoder.execute_draft_batch(logits, draft_step=3)
    with pytest.raises(ValueError, match="used twice"):
        decoder.add_batch(
            [
                GuidedRequest.context(REGEX, request_id=1, seq_slot=0),
                GuidedRequest.context(REGEX, request_id=2, seq_slot=0),
            ]
        )


def test_draft_logits_over_a_pruned_vocabulary_are_masked_through_d2t(
    tokenizer, make_factory
) -> None:
    factory = make_factory("xgrammar")
    decoder = make(tokenizer, factory, slots=1)
    step(decoder, [GuidedRequest.context(REGEX, request_id=1, seq_slot=0)])
    yes = tokenizer.encode("yes-12!")
    step(
        decoder,
        [GuidedRequest.generation(REGEX, request_id=1, seq_slot=0, new_token=yes[0])],
    )
    # A draft vocabulary of 4096 tokens: column i is target token i + d2t[i].
    generator = torch.Generator().manual_seed(0)
    targets = torch.randperm(tokenizer.vocab_size, generator=generator)[:4096]
    targets[:2] = torch.tensor([yes[2], tokenizer.encode("x")[0]])  # one allowed, one not
    d2t = (targets - torch.arange(4096)).to(torch.int32)
    decoder.add_draft_batch([yes[1]], [1], draft_step=0)
    logits = torch.zeros(1, 4096)
    assert decoder.execute_draft_batch(logits, d2t=d2t, draft_step=0) == []
    fresh = factory.create(REGEX)
    assert feed_tokens(fresh, yes[:2]) == 2
    allowed = bitmask_to_bool_mask(
        next_token_mask(fresh, tokenizer.vocab_size), tokenizer.vocab_size
    )
    assert torch.equal(torch.isfinite(logits[0]), allowed[targets])
    assert torch.isfinite(logits[0, 0]) and torch.isinf(logits[0, 1])


class UncheckedMatcher(ScriptedMatcher):
    """A scripted matcher with an unchecked ``advance``: its rows mask out ``masked`` (so the
    decoder must not advance by those), and its ``advance`` counts its calls."""

    unchecked_advance = True

    def __init__(self, reject: set[int], masked: set[int]) -> None:
        super().__init__(reject, dead=set())
        self.masked, self.advances = masked, 0

    def advance(self, token_id: int) -> bool:
        self.advances += 1
        return self.accept_token(token_id)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        super().fill_next_token_bitmask(bitmask, index)
        for token in self.masked:
            bitmask[index, token // 32] &= ~(1 << token % 32)


class UncheckedFactory(ScriptedFactory):
    def create(self, params: GuidedDecodingParams) -> UncheckedMatcher:
        self.made.append(UncheckedMatcher(**self.kwargs))
        return self.made[-1]


def test_a_draft_token_its_row_masks_out_is_not_fed_to_an_unchecked_advance(tokenizer) -> None:
    factory = UncheckedFactory(reject=set(), masked={55})
    decoder = make(tokenizer, factory, drafts=3, slots=1)
    step(decoder, [GuidedRequest.context(REGEX, request_id=1, seq_slot=0)])
    failures = step(
        decoder,
        [
            GuidedRequest.generation(
                REGEX, request_id=1, seq_slot=0, new_token=5, draft_tokens=[6, 55, 7]
            )
        ],
    )
    assert failures == []
    matcher = factory.made[0]
    assert matcher.history == [5, 6]  # the new token, then the one draft its row allows
    assert matcher.advances == 2
    assert decoder.token_mask_host[:3].tolist() == [1, 1, 0]  # no row after the masked draft
    assert decoder.rollback_rejected_batch([2]) == []  # verification stops at 55 too
    assert matcher.history == [5, 6]


def test_a_draft_token_its_row_allows_but_its_grammar_rejects_fails_that_request(
    tokenizer,
) -> None:
    factory = UncheckedFactory(reject={55}, masked=set())
    decoder = make(tokenizer, factory, drafts=3, slots=2)
    contexts = [GuidedRequest.context(REGEX, request_id=i + 1, seq_slot=i) for i in (0, 1)]
    step(decoder, contexts)
    failures = step(
        decoder,
        [
            GuidedRequest.generation(
                REGEX, request_id=1, seq_slot=0, new_token=5, draft_tokens=[55]
            ),
            GuidedRequest.generation(
                REGEX, request_id=2, seq_slot=1, new_token=5, draft_tokens=[6]
            ),
        ],
    )
    assert len(failures) == 1 and failures[0][0] == 1
    assert (
        "draft token 55 is allowed by its bitmask row but its grammar rejects it" in failures[0][1]
    )
    assert factory.made[1].history == [5, 6]  # the other request goes on
    assert decoder.grammar_matchers[0] is None
