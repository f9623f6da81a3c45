"""GuidedDecoder: one batched step, failure isolation, row layout and draft rows."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import (
    GrammarMatcher,
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingParams,
    GuidedRequest,
    TokenizerInfo,
    testing,
)
from guidedec.bitmask import apply_bitmask, bitmask_size
from guidedec.testing import feed_tokens, next_token_mask
from guidedec.tokenizer import default_tokenizer_dir

SCHEMA = GuidedDecodingParams(
    json_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
)
REGEX = GuidedDecodingParams(regex=r"(yes|no)!")


@pytest.fixture
def make_decoder(
    tokenizer: TokenizerInfo, make_factory: Callable[..., GrammarMatcherFactory]
) -> Callable[..., GuidedDecoder]:
    def make(
        backend: str = "auto", *, max_num_sequences: int = 4, drafts: int = 0
    ) -> GuidedDecoder:
        return testing.make_decoder(
            tokenizer,
            backend,
            factory=make_factory(backend),
            max_num_sequences=max_num_sequences,
            max_num_draft_tokens=drafts,
        )

    return make


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def expected_row(factory: GrammarMatcherFactory, params, tokens: list[int], vocab: int):
    matcher = factory.create(params)
    assert feed_tokens(matcher, tokens) == len(tokens)
    return next_token_mask(matcher, vocab)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_step_masks_guided_rows_and_leaves_unguided_rows_alone(
    backend: str, make_decoder, make_factory, tokenizer: TokenizerInfo
) -> None:
    decoder = make_decoder(backend)
    vocab = tokenizer.vocab_size
    decoder.add_batch(
        [
            GuidedRequest.context(SCHEMA, request_id=10, seq_slot=2),
            GuidedRequest.context(None, request_id=11, seq_slot=0),
            GuidedRequest.context(REGEX, request_id=12, seq_slot=1),
        ]
    )
    logits = random_logits(3, vocab)
    original = logits.clone()
    assert decoder.execute(logits) == []
    expected = original.clone()
    factory = make_factory(backend)
    rows = torch.stack(
        [
            expected_row(factory, SCHEMA, [], vocab),
            torch.full_like(decoder.bitmask_host[0], -1),
            expected_row(factory, REGEX, [], vocab),
        ]
    )
    apply_bitmask(expected, rows, backend="torch")
    assert torch.equal(logits, expected)
    assert torch.equal(logits[1], original[1])

    # Next step: the sampled tokens advance the matchers.
    first = [tokenizer.encode('{"n"')[0], 5, tokenizer.encode("yes")[0]]
    decoder.add_batch(
        [
            GuidedRequest.generation(SCHEMA, request_id=10, seq_slot=2, new_token=first[0]),
            GuidedRequest.generation(None, request_id=11, seq_slot=0, new_token=first[1]),
            GuidedRequest.generation(REGEX, request_id=12, seq_slot=1, new_token=first[2]),
        ]
    )
    logits = random_logits(3, vocab, seed=1)
    assert decoder.execute(logits) == []
    assert torch.equal(decoder.bitmask_host[0], expected_row(factory, SCHEMA, first[:1], vocab))
    assert torch.equal(decoder.bitmask_host[2], expected_row(factory, REGEX, first[2:], vocab))
    assert decoder.token_mask_host[:3].tolist() == [1, 0, 1]
    assert not torch.isnan(logits).any()


def test_a_malformed_guide_fails_only_its_request(make_decoder, tokenizer: TokenizerInfo) -> None:
    decoder = make_decoder("auto")
    decoder.add_batch(
        [
            GuidedRequest.context(SCHEMA, request_id=1, seq_slot=0),
            GuidedRequest.context(
                GuidedDecodingParams(regex="(unclosed"), request_id=2, seq_slot=1
            ),
            GuidedRequest.context(GuidedDecodingParams(choice=[]), request_id=3, seq_slot=2),
        ]
    )
    logits = random_logits(3, tokenizer.vocab_size)
    original = logits.clone()
    failures = dict(decoder.execute(logits))
    assert set(failures) == {2, 3}
    assert "regex" in failures[2] and "request 2" in failures[2]
    assert "choice" in failures[3]
    assert torch.isinf(logits[0]).any()
    assert torch.equal(logits[1:], original[1:])  # failed rows are left unmasked: no NaN

    decoder.add_batch([GuidedRequest.generation(SCHEMA, request_id=2, seq_slot=1, new_token=5)])
    failures = dict(decoder.execute(random_logits(1, tokenizer.vocab_size)))
    assert "no grammar matcher" in failures[2]


def test_a_rejected_sampled_token_fails_its_request(make_decoder, tokenizer: TokenizerInfo) -> None:
    decoder = make_decoder("xgrammar")
    decoder.add_batch([GuidedRequest.context(REGEX, request_id=7, seq_slot=0)])
    decoder.execute(random_logits(1, tokenizer.vocab_size))
    bad = tokenizer.encode("maybe")[0]
    decoder.add_batch([GuidedRequest.generation(REGEX, request_id=7, seq_slot=0, new_token=bad)])
    failures = decoder.execute(random_logits(1, tokenizer.vocab_size))
    assert failures and failures[0][0] == 7 and "rejected" in failures[0][1]


class DeadEndMatcher(GrammarMatcher):
    """A matcher whose next state allows nothing (an unsatisfiable grammar)."""

    def accept_token(self, token_id: int) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        bitmask[index].zero_()

    def is_terminated(self) -> bool:
        return False


class DeadEndFactory(GrammarMatcherFactory):
    def compile(self, params) -> object:
        return params

    def create(self, params) -> GrammarMatcher:
        return DeadEndMatcher()


def test_dead_end_row_fails_request_without_nan(tokenizer: TokenizerInfo) -> None:
    decoder = testing.make_decoder(tokenizer, factory=DeadEndFactory(), max_num_sequences=2)
    decoder.add_batch([GuidedRequest.context(SCHEMA, request_id=5, seq_slot=1)])
    logits = random_logits(1, tokenizer.vocab_size)
    failures = decoder.execute(logits)
    assert failures == [
        (5, "request 5 (slot 1) reached a grammar state that allows no token (dead end)")
    ]
    assert not torch.isinf(logits).any() and not torch.isnan(logits).any()
    assert decoder.grammar_matchers[1] is None


def test_terminated_request_rows_are_not_applied(make_decoder, tokenizer: TokenizerInfo) -> None:
    decoder = make_decoder("llguidance")
    params = GuidedDecodingParams(choice=["ok"])
    decoder.add_batch([GuidedRequest.context(params, request_id=1, seq_slot=0)])
    decoder.execute(random_logits(1, tokenizer.vocab_size))
    for token in [*tokenizer.encode("ok"), tokenizer.eos_token_id]:
        decoder.add_batch(
            [GuidedRequest.generation(params, request_id=1, seq_slot=0, new_token=token)]
        )
        logits = random_logits(1, tokenizer.vocab_size)
        assert decoder.execute(logits) == []
    assert decoder.grammar_matchers[0] is not None and decoder.grammar_matchers[0].is_terminated()
    assert decoder.token_mask_host[0] == 0
    assert not torch.isinf(logits).any()


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_draft_rows_equal_a_fresh_matcher_fed_the_draft_prefix(
    backend: str, make_decoder, make_factory, tokenizer: TokenizerInfo
) -> None:
    decoder = make_decoder(backend, drafts=3)
    vocab = tokenizer.vocab_size
    text = tokenizer.encode('{"n": 12345}')
    decoder.add_batch(
        [
            GuidedRequest.context(SCHEMA, request_id=1, seq_slot=0),
            GuidedRequest.context(REGEX, request_id=2, seq_slot=1),
        ]
    )
    decoder.execute(random_logits(2, vocab))
    drafts = text[1:4]
    decoder.add_batch(
        [
            GuidedRequest.generation(
                SCHEMA, request_id=1, seq_slot=0, new_token=text[0], draft_tokens=drafts
            ),
            GuidedRequest.generation(
                REGEX, request_id=2, seq_slot=1, new_token=tokenizer.encode("no")[0]
            ),
        ]
    )
    logits = random_logits(5, vocab)
    assert decoder.execute(logits) == []
    factory = make_factory(backend)
    for i in range(4):
        assert torch.equal(
            decoder.bitmask_host[i], expected_row(factory, SCHEMA, text[: i + 1], vocab)
        ), i
    assert decoder.num_advanced_tokens[0] == 4 and decoder.num_guided_tokens[0] == 4
    assert torch.equal(
        decoder.bitmask_host[4], expected_row(factory, REGEX, tokenizer.encode("no")[:1], vocab)
    )


def test_draft_guiding_stops_at_a_rejected_draft_token(
    make_decoder, tokenizer: TokenizerInfo
) -> None:
    decoder = make_decoder("xgrammar", drafts=4)
    decoder.add_batch([GuidedRequest.context(REGEX, request_id=1, seq_slot=0)])
    decoder.execute(random_logits(1, tokenizer.vocab_size))
    yes = tokenizer.encode("yes")[0]
    bogus = tokenizer.encode("zzz")[0]
    decoder.add_batch(
        [
            GuidedRequest.generation(
                REGEX, request_id=1, seq_slot=0, new_token=yes, draft_tokens=[bogus, bogus]
            )
        ]
    )
    assert decoder.execute(random_logits(3, tokenizer.vocab_size)) == []
    assert decoder.token_mask_host[:3].tolist() == [1, 0, 0]
    assert decoder.num_advanced_tokens[0] == 1


def test_add_batch_rejects_more_rows_than_the_buffers_hold(make_decoder) -> None:
    decoder = make_decoder("xgrammar", max_num_sequences=1, drafts=1)
    with pytest.raises(ValueError, match="bitmask rows"):
        decoder.add_batch(
            [
                GuidedRequest.context(SCHEMA, request_id=1, seq_slot=0),
                GuidedRequest.generation(
                    SCHEMA, request_id=2, seq_slot=0, new_token=1, draft_tokens=[1]
                ),
            ]
        )
    with pytest.raises(ValueError, match="seq_slot"):
        decoder.add_batch([GuidedRequest.context(SCHEMA, request_id=1, seq_slot=3)])


def test_decoder_width_is_the_tokenizers_padded_vocab(tokenizer: TokenizerInfo) -> None:
    padded = TokenizerInfo.from_tokenizer_json(
        default_tokenizer_dir(), vocab_size=tokenizer.vocab_size + 32
    )
    decoder = testing.make_decoder(padded, max_num_sequences=1)
    assert decoder.vocab_size == padded.vocab_size
    assert decoder.bitmask_host.shape == (1, bitmask_size(padded.vocab_size))


PRIOR_TEXT = '{"n": 1234}'


@settings(max_examples=25, deadline=None)
@given(data=st.data(), backend=st.sampled_from(["xgrammar", "llguidance"]))
def test_prior_tokens_advance_the_matcher_as_steps_of_one_token_would(
    data: st.DataObject, backend: str, tokenizer: TokenizerInfo, make_factory
) -> None:
    """A run of tokens split into steps of any sizes (all but each step's last as
    ``prior_tokens``) leaves every step's row and advance count as a fresh matcher fed that
    prefix: the same as one token per step."""
    factory = make_factory(backend)
    decoder = testing.make_decoder(tokenizer, backend, factory=factory, max_num_sequences=2)
    tokens = tokenizer.encode(PRIOR_TEXT)[:-1]  # the value left open: each row has a token
    cuts = sorted(data.draw(st.sets(st.integers(1, len(tokens) - 1), max_size=len(tokens) - 1)))
    steps = [tokens[a:b] for a, b in zip([0, *cuts], [*cuts, len(tokens)], strict=True)]
    decoder.add_batch([GuidedRequest.context(SCHEMA, request_id=1, seq_slot=1)])
    assert decoder.build() == []
    fed = 0
    for step in steps:
        request = GuidedRequest.generation(
            SCHEMA, request_id=1, seq_slot=1, new_token=step[-1], prior_tokens=step[:-1]
        )
        decoder.add_batch([request])
        assert decoder.build() == []
        fed += len(step)
        assert decoder.num_advanced_tokens[1] == len(step)
        assert decoder.token_mask_host[0] == 1
        expected = expected_row(factory, SCHEMA, tokens[:fed], tokenizer.vocab_size)
        assert torch.equal(decoder.bitmask_host[0], expected)


@pytest.mark.parametrize("first_iteration", [False, True])
def test_a_rejected_prior_token_fails_its_request_alone(
    first_iteration: bool, make_decoder, tokenizer: TokenizerInfo
) -> None:
    decoder = make_decoder("xgrammar")
    yes, bad = tokenizer.encode("yes")[0], tokenizer.encode("maybe")[0]
    if not first_iteration:
        decoder.add_batch([GuidedRequest.context(REGEX, request_id=7, seq_slot=0)])
        assert decoder.build() == []
    decoder.add_batch(
        [
            GuidedRequest.generation(
                REGEX,
                request_id=7,
                seq_slot=0,
                new_token=yes,
                prior_tokens=[bad],
                is_generation_only_first_iteration=first_iteration,
            ),
            GuidedRequest.context(SCHEMA, request_id=8, seq_slot=1),
        ]
    )
    failures = dict(decoder.build())
    assert list(failures) == [7] and f"token {bad} is rejected" in failures[7]
    assert decoder.token_mask_host[:2].tolist() == [0, 1]
    assert decoder.grammar_matchers[0] is None


def test_a_guide_that_ends_inside_prior_tokens_has_no_row(
    make_decoder, tokenizer: TokenizerInfo
) -> None:
    """The tokens after the grammar's end are not fed: the output ends there, unmasked."""
    decoder = make_decoder("llguidance")
    decoder.add_batch([GuidedRequest.context(REGEX, request_id=3, seq_slot=0)])
    assert decoder.build() == []
    done = tokenizer.encode("no!")
    stop = tokenizer.stop_token_ids[0]
    decoder.add_batch(
        [
            GuidedRequest.generation(
                REGEX, request_id=3, seq_slot=0, new_token=stop, prior_tokens=[*done, stop]
            )
        ]
    )
    assert decoder.build() == []
    assert decoder.token_mask_host[0] == 0
    matcher = decoder.grammar_matchers[0]
    assert matcher is not None and matcher.is_terminated()


def test_prior_tokens_go_with_a_generating_request_without_drafts(make_decoder) -> None:
    decoder = make_decoder("xgrammar", drafts=2)
    with pytest.raises(ValueError, match="prior_tokens"):
        decoder.add_batch(
            [
                GuidedRequest.generation(
                    REGEX, request_id=1, seq_slot=0, new_token=5, prior_tokens=[4], draft_tokens=[6]
                )
            ]
        )


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_an_unchanged_request_gets_the_row_of_its_matchers_state_again(
    backend: str, make_decoder, tokenizer: TokenizerInfo, make_factory
) -> None:
    """A step whose token the engine did not keep: the row is filled again, nothing advances;
    the next token then goes on from there."""
    decoder = make_decoder(backend)
    decoder.add_batch([GuidedRequest.context(SCHEMA, request_id=1, seq_slot=2)])
    assert decoder.build() == []
    first = decoder.bitmask_host[0].clone()
    tokens = tokenizer.encode('{"n": 4')
    for token in tokens[:-1]:
        step = GuidedRequest.generation(SCHEMA, request_id=1, seq_slot=2, new_token=token)
        decoder.add_batch([step])
        assert decoder.build() == []
    before = decoder.bitmask_host[0].clone()
    for _ in range(2):
        decoder.bitmask_host[0].zero_()
        decoder.add_batch([GuidedRequest.unchanged(SCHEMA, request_id=1, seq_slot=2)])
        assert decoder.build() == []
        assert decoder.num_advanced_tokens[2] == 0 and decoder.token_mask_host[0] == 1
        assert torch.equal(decoder.bitmask_host[0], before)
    assert not torch.equal(before, first)
    decoder.add_batch(
        [GuidedRequest.generation(SCHEMA, request_id=1, seq_slot=2, new_token=tokens[-1])]
    )
    assert decoder.build() == []
    factory = make_factory(backend)
    assert torch.equal(
        decoder.bitmask_host[0], expected_row(factory, SCHEMA, tokens, tokenizer.vocab_size)
    )


def test_an_unchanged_request_carries_no_token(make_decoder) -> None:
    decoder = make_decoder("xgrammar")
    with pytest.raises(ValueError, match="refill carries no new_token"):
        decoder.add_batch(
            [
                GuidedRequest(
                    REGEX, 1, 0, is_generation_in_progress_state=True, new_token=4, refill=True
                )
            ]
        )


@pytest.mark.parametrize("swap", [True, False])
def test_moving_a_slot_takes_its_grammar_state_along(
    swap: bool, make_decoder, tokenizer: TokenizerInfo, make_factory
) -> None:
    """An engine whose batch index is the slot moves a request: its matcher goes with it (the
    rows it fills are its own), a swap brings the other back, a one-way move drops it."""
    decoder = make_decoder("xgrammar")
    yes = tokenizer.encode("yes")
    decoder.add_batch(
        [
            GuidedRequest.context(REGEX, request_id=0, seq_slot=0),
            GuidedRequest.context(SCHEMA, request_id=1, seq_slot=1),
        ]
    )
    assert decoder.build() == []
    regex_matcher, schema_matcher = decoder.grammar_matchers[:2]
    regex_closing, schema_closing = decoder.closer._slots[:2]
    decoder.move_slot(0, 1, swap=swap)
    assert decoder.grammar_matchers[1] is regex_matcher
    assert decoder.grammar_matchers[0] is (schema_matcher if swap else None)
    assert decoder.closer._slots[1] is regex_closing
    assert (decoder.closer._slots[0] is schema_closing) is swap
    steps = [GuidedRequest.generation(REGEX, request_id=0, seq_slot=1, new_token=yes[0])]
    decoder.add_batch(steps)
    assert decoder.build() == []
    factory = make_factory("xgrammar")
    expected = expected_row(factory, REGEX, yes[:1], tokenizer.vocab_size)
    assert torch.equal(decoder.bitmask_host[0], expected)
    with pytest.raises(ValueError, match="out of range"):
        decoder.move_slot(0, 4, swap=True)


def test_a_backend_error_names_itself_in_the_failure(
    make_decoder, tokenizer: TokenizerInfo
) -> None:
    """A pattern llguidance compiles but cannot lex: the sampled token's rejection says why."""
    decoder = make_decoder("llguidance")
    guide = GuidedDecodingParams(json_schema={"type": "string", "pattern": "^a{1000000}$"})
    decoder.add_batch([GuidedRequest.context(guide, request_id=5, seq_slot=0)])
    assert decoder.build() == []
    quote = tokenizer.encode('"')[0]
    decoder.add_batch([GuidedRequest.generation(guide, request_id=5, seq_slot=0, new_token=quote)])
    failures = dict(decoder.build())
    assert "lexer error: too many expressions" in failures[5], failures
