"""Batch mask fill: the backends' parallel batch calls against one row at a time (the oracle),
error isolation, the ``auto`` timing policy, and the decoder's waves of rows."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import ClassVar

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import guidedec.grammar.batch_fill as batch_fill
from guidedec import (
    GrammarMatcher,
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    GuidedRequest,
    TokenizerInfo,
)
from guidedec.bench.cases import JSON_CASES
from guidedec.bitmask import allocate_bitmask
from guidedec.errors import MatcherError
from guidedec.grammar.batch_fill import PROBES, BatchFiller
from guidedec.grammar.matcher import fill_one_by_one
from guidedec.testing import make_decoder

BACKENDS = ("xgrammar", "llguidance")
FIXTURES = HealthCheck.function_scoped_fixture
CASE_PARAMS = [GuidedDecodingParams(json_schema=schema) for schema, _ in JSON_CASES]


def case_tokens(tokenizer: TokenizerInfo) -> list[list[int]]:
    return [tokenizer.encode(json.dumps(instance)) for _, instance in JSON_CASES]


def advanced_matchers(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, positions: Sequence[int]
) -> list[GrammarMatcher]:
    """Matcher ``i`` on case ``i % len(cases)``, fed its first ``positions[i]`` tokens."""
    tokens = case_tokens(tokenizer)
    matchers = []
    for i, position in enumerate(positions):
        case = i % len(JSON_CASES)
        matcher = factory.create(CASE_PARAMS[case])
        for token in tokens[case][: position % len(tokens[case])]:
            assert matcher.accept_token(token)
        matchers.append(matcher)
    return matchers


@pytest.mark.parametrize("backend", BACKENDS)
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_parallel_fill_equals_one_row_at_a_time(
    backend: str, data: st.DataObject, make_factory, tokenizer: TokenizerInfo
) -> None:
    size = data.draw(st.integers(4, 24), label="batch")
    positions = data.draw(st.lists(st.integers(0, 200), min_size=size, max_size=size))
    num_rows = size + data.draw(st.integers(0, 8), label="spare rows")
    rows = data.draw(st.permutations(range(num_rows)), label="rows")[:size]
    matchers = advanced_matchers(make_factory(backend), tokenizer, positions)
    expected = allocate_bitmask(num_rows, tokenizer.vocab_size)
    assert fill_one_by_one(matchers, expected, rows) == [None] * size
    got = allocate_bitmask(num_rows, tokenizer.vocab_size)
    got.fill_(0x5A5A5A5A)  # rows not filled must be left alone
    untouched = [r for r in range(num_rows) if r not in rows]
    cls = type(matchers[0])
    assert cls.parallel_fill
    errors = cls.fill_next_token_bitmasks(matchers, got, rows, num_threads=2)
    assert errors == [None] * size
    assert torch.equal(got[list(rows)], expected[list(rows)])
    assert bool((got[untouched] == 0x5A5A5A5A).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_terminated_matcher_fails_alone_in_a_batch(
    backend: str, make_factory, tokenizer: TokenizerInfo
) -> None:
    factory = make_factory(backend)
    matchers = advanced_matchers(factory, tokenizer, [3, 5, 7, 9, 11])
    done = factory.create(GuidedDecodingParams(regex="a"))
    assert done.accept_token(tokenizer.encode("a")[0])
    assert done.accept_token(tokenizer.eos_token_id)
    assert done.is_terminated()
    batch = [*matchers[:2], done, *matchers[2:]]
    rows = list(range(len(batch)))
    got = allocate_bitmask(len(batch), tokenizer.vocab_size)
    errors = type(done).fill_next_token_bitmasks(batch, got, rows, num_threads=2)
    assert [e is None for e in errors] == [True, True, False, True, True, True]
    assert isinstance(errors[2], ValueError) and "terminated" in str(errors[2])
    expected = allocate_bitmask(len(batch), tokenizer.vocab_size)
    fill_one_by_one(matchers, expected, [0, 1, 3, 4, 5])
    assert torch.equal(got[[0, 1, 3, 4, 5]], expected[[0, 1, 3, 4, 5]])


def test_an_llguidance_matcher_in_error_fails_alone(make_factory, tokenizer: TokenizerInfo) -> None:
    factory = make_factory("llguidance")
    matchers = advanced_matchers(factory, tokenizer, [6, 2, 4, 0, 8])
    broken = matchers[3]  # at the start of an object: only '{' and whitespace are allowed
    broken._matcher.consume_token(tokenizer.encode("zzz")[0])  # type: ignore[attr-defined]
    assert broken._matcher.is_error()  # type: ignore[attr-defined]
    got = allocate_bitmask(5, tokenizer.vocab_size)
    errors = type(broken).fill_next_token_bitmasks(matchers, got, range(5), num_threads=2)
    assert [e is None for e in errors] == [True, True, True, False, True]
    assert isinstance(errors[3], MatcherError) and "llguidance matcher error" in str(errors[3])
    expected = allocate_bitmask(5, tokenizer.vocab_size)
    fill_one_by_one([m for i, m in enumerate(matchers) if i != 3], expected, [0, 1, 2, 4])
    assert torch.equal(got[[0, 1, 2, 4]], expected[[0, 1, 2, 4]])


def test_batch_filler_groups_mixed_backends(make_factory, tokenizer: TokenizerInfo) -> None:
    xg = advanced_matchers(make_factory("xgrammar"), tokenizer, [1, 2, 3, 4, 5])
    ll = advanced_matchers(make_factory("llguidance"), tokenizer, [6, 7, 8, 9])
    matchers = [m for pair in zip(xg, ll, strict=False) for m in pair] + xg[len(ll) :]
    rows = list(reversed(range(len(matchers))))
    expected = allocate_bitmask(len(matchers), tokenizer.vocab_size)
    fill_one_by_one(matchers, expected, rows)
    got = allocate_bitmask(len(matchers), tokenizer.vocab_size)
    assert BatchFiller("parallel", 2).fill(matchers, got, rows) == [None] * len(matchers)
    assert torch.equal(got, expected)


class _Recording(GrammarMatcher):
    """A matcher whose fills only count calls; ``parallel`` calls take less fake time when
    ``parallel_is_faster``."""

    parallel_fill = True
    calls: ClassVar[list[str]] = []
    parallel_is_faster = True
    now = 0.0

    def accept_token(self, token_id: int) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        _Recording.now += 1.0 if self.parallel_is_faster else 0.1
        _Recording.calls.append("one")

    def is_terminated(self) -> bool:
        return False

    @classmethod
    def fill_next_token_bitmasks(
        cls,
        matchers: Sequence[GrammarMatcher],
        bitmask: torch.Tensor,
        rows: Sequence[int],
        *,
        num_threads: int,
    ) -> list[Exception | None]:
        cls.now += 0.5 * len(matchers)
        cls.calls.append("batch")
        return [None] * len(matchers)


@pytest.mark.parametrize("parallel_is_faster", [True, False])
def test_auto_mode_measures_then_keeps_the_faster_way(
    parallel_is_faster: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Recording, "parallel_is_faster", parallel_is_faster)
    filler = BatchFiller("auto", 2, clock=lambda: _Recording.now)
    size = 8
    matchers = [_Recording() for _ in range(size)]
    bitmask = torch.zeros(size, 1, dtype=torch.int32)
    _Recording.calls = []
    for _ in range(PROBES):  # each call fills both ways, in alternating order
        filler.fill(matchers, bitmask, range(size))
    probing = list(_Recording.calls)
    assert probing.count("batch") == PROBES and probing.count("one") == PROBES * size
    first, second = probing[: size + 1], probing[size + 1 : 2 * size + 2]
    assert first == ["batch", *["one"] * size] and second == [*["one"] * size, "batch"]
    chosen = "parallel" if parallel_is_faster else "sequential"
    assert filler.decisions() == {("_Recording", 8): chosen}
    _Recording.calls = []
    for _ in range(10):
        filler.fill(matchers, bitmask, range(size))
    if parallel_is_faster:
        assert _Recording.calls == ["batch"] * 10
    else:
        assert _Recording.calls == ["one"] * (10 * size)


class _ColdFirst(_Recording):
    """Rows cost 1.0 one by one and 0.9 in parallel, but the first way of each call pays 5x
    (what a backend builds lazily on first use of a state, which the second way finds ready).
    The clock tells which way is first: ``auto`` reads it before and after each way."""

    warm = False
    ticks = 0

    @classmethod
    def clock(cls) -> float:
        cls.ticks += 1
        cls.warm = cls.ticks % 4 in (2, 3)  # after the first way of a call, until its end
        return cls.now

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        _ColdFirst.now += 1.0 if _ColdFirst.warm else 5.0

    @classmethod
    def fill_next_token_bitmasks(
        cls,
        matchers: Sequence[GrammarMatcher],
        bitmask: torch.Tensor,
        rows: Sequence[int],
        *,
        num_threads: int,
    ) -> list[Exception | None]:
        cls.now += 0.9 * len(matchers) * (1 if cls.warm else 5)
        return [None] * len(matchers)


def test_auto_mode_cancels_the_cost_of_going_first() -> None:
    """The paired ratios are 4.5 and 0.18 in turn: their median (2.3) would pick one by one,
    their geometric mean sees that parallel is 0.9x."""
    filler = BatchFiller("auto", 2, clock=_ColdFirst.clock)
    matchers = [_ColdFirst() for _ in range(8)]
    for _ in range(PROBES):
        filler.fill(matchers, torch.zeros(8, 1, dtype=torch.int32), range(8))
    assert _ColdFirst.ticks == 4 * PROBES
    assert filler.decisions() == {("_ColdFirst", 8): "parallel"}


def test_auto_mode_measures_again_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_fill, "FIRST_REPROBE", 3)
    monkeypatch.setattr(batch_fill, "REPROBE_EVERY", 5)
    filler = BatchFiller("auto", 2, clock=lambda: _Recording.now)
    matchers = [_Recording() for _ in range(4)]
    bitmask = torch.zeros(4, 1, dtype=torch.int32)
    for _ in range(PROBES):
        filler.fill(matchers, bitmask, range(4))
    assert filler.decisions() == {("_Recording", 4): "parallel"}
    for _ in range(3):
        filler.fill(matchers, bitmask, range(4))
    assert filler.decisions() == {("_Recording", 4): "measuring"}  # the third call measured
    for _ in range(PROBES - 1):
        filler.fill(matchers, bitmask, range(4))
    for _ in range(4):  # later measurements are further apart
        filler.fill(matchers, bitmask, range(4))
    assert filler.decisions() == {("_Recording", 4): "parallel"}
    filler.fill(matchers, bitmask, range(4))
    assert filler.decisions() == {("_Recording", 4): "measuring"}


def test_small_batches_single_threads_and_sequential_mode_fill_one_by_one() -> None:
    def calls_of(filler: BatchFiller, size: int) -> list[str]:
        _Recording.calls = []
        filler.fill([_Recording() for _ in range(size)], torch.zeros(size, 1), range(size))
        return _Recording.calls

    assert calls_of(BatchFiller("parallel", 2), batch_fill.MIN_PARALLEL_ROWS - 1) == ["one"] * 3
    assert calls_of(BatchFiller("parallel", 2), 6) == ["batch"]
    assert calls_of(BatchFiller("parallel", 1), 6) == ["one"] * 6
    assert calls_of(BatchFiller("sequential", 8), 6) == ["one"] * 6


def test_fill_settings_are_checked(tokenizer: TokenizerInfo) -> None:
    with pytest.raises(ValueError, match="fill mode"):
        BatchFiller("fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads"):
        BatchFiller("auto", 0)
    with pytest.raises(ValueError, match="fill_mode"):
        GuidedDecodingConfig(tokenizer=tokenizer, fill_mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fill_threads"):
        GuidedDecodingConfig(tokenizer=tokenizer, fill_threads=0)


# --- the decoder's waves: parallel against sequential, step by step --------------------------


def _decoder(
    backend: str, mode: str, factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, k: int
) -> GuidedDecoder:
    return make_decoder(
        tokenizer,
        backend,  # type: ignore[arg-type]
        factory=factory,
        max_num_sequences=10,
        max_num_draft_tokens=k,
        fill_mode=mode,
        fill_threads=2,
        max_rollback_tokens=k,
    )


def _state(decoder: GuidedDecoder, rows: int) -> tuple[object, ...]:
    return (
        decoder.bitmask_host[:rows].clone(),
        decoder.token_mask_host[:rows].clone(),
        list(decoder.num_advanced_tokens),
        list(decoder.num_guided_tokens),
        list(decoder._num_verifiable_tokens),
        decoder.stats.rows_filled,
    )


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16), k=st.sampled_from([0, 3]))
def test_decoder_parallel_waves_equal_sequential_fill(
    backend: str, seed: int, k: int, make_factory: Callable[..., GrammarMatcherFactory], tokenizer
) -> None:
    """Ten requests (one unguided) step through their instances with drafts that are right,
    wrong (a random token) or end with the stop token; both decoders must agree on every row,
    counter and failure, and roll back alike."""
    rng = random.Random(seed)
    factory = make_factory(backend)
    decoders = [_decoder(backend, m, factory, tokenizer, k) for m in ("parallel", "sequential")]
    tokens = case_tokens(tokenizer)
    guides = [CASE_PARAMS[i % len(CASE_PARAMS)] if i != 4 else None for i in range(10)]
    positions = [0] * 10
    context = [GuidedRequest.context(g, request_id=i, seq_slot=i) for i, g in enumerate(guides)]
    for decoder in decoders:
        decoder.add_batch(context)
    results = [d.build() for d in decoders]
    assert results[0] == results[1]
    for _ in range(6):
        batch = []
        for i, guide in enumerate(guides):
            case = tokens[i % len(tokens)]
            true = case[positions[i] : positions[i] + 1 + k]
            if len(true) < 1 + k:
                true = [*true, tokenizer.eos_token_id] + [0] * (1 + k)
            drafts = list(true[1 : 1 + k])
            if drafts and rng.random() < 0.4:
                drafts[rng.randrange(k)] = rng.randrange(tokenizer.vocab_size)
            new_token = true[0] if rng.random() < 0.95 else rng.randrange(tokenizer.vocab_size)
            batch.append(
                GuidedRequest.generation(
                    guide, request_id=i, seq_slot=i, new_token=new_token, draft_tokens=drafts
                )
            )
        results = []
        for decoder in decoders:
            decoder.add_batch(batch)
            results.append(decoder.build())
        assert results[0] == results[1]
        rows = decoders[0]._batch().num_bitmask_tokens
        a, b = (_state(d, rows) for d in decoders)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # type: ignore[arg-type]
        assert a[2:] == b[2:]
        accepted = [
            rng.randint(1, max(1, decoders[0]._num_verifiable_tokens[i])) for i in range(10)
        ]
        rolled = [d.rollback_rejected_batch(accepted) for d in decoders]
        assert rolled[0] == rolled[1]
        for i in range(10):
            positions[i] += accepted[i]


# --- the engine ------------------------------------------------------------------------------


def test_engine_outputs_do_not_depend_on_the_fill_mode() -> None:
    """Eight guided requests (so a wave has at least 4 rows of a backend) with n-gram drafts:
    the parallel and sequential engines agree token for token, and ``auto`` reports what it
    measured."""
    from guidedec import LLM, SamplingParams

    guides = [CASE_PARAMS[i % len(CASE_PARAMS)] for i in range(8)]
    results = {}
    for mode in ("parallel", "sequential", "auto"):
        llm = LLM(
            "tiny-random",
            backend="llguidance",
            max_num_seqs=8,
            speculative="ngram",
            num_draft_tokens=3,
            json_whitespace="compact",
            fill_mode=mode,  # type: ignore[arg-type]
        )
        for guide in CASE_PARAMS:  # compiled before: all 8 requests start in the same step
            llm.factory.compile(guide)
        params = [SamplingParams(max_tokens=24, guided_decoding=g) for g in guides]
        outputs = llm.generate([f"Record {i}:" for i in range(8)], params)
        results[mode] = [(o.token_ids, o.finish_reason, o.error) for o in outputs]
        if mode == "auto":
            decisions = llm.decoder.fill_decisions()
            assert decisions and all(b == "llguidance" for b, _ in decisions)
        llm.close()
    assert results["parallel"] == results["sequential"] == results["auto"]
    assert all(error is None for _, _, error in results["parallel"])


def test_cli_fill_mode_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from guidedec import cli_generate
    from guidedec.cli import build_parser

    seen: dict[str, object] = {}
    monkeypatch.setattr(cli_generate, "LLM", lambda *args, **kwargs: seen.update(kwargs))
    for argv, expected in (
        (["generate", "hi"], "auto"),
        (["serve", "--fill-mode", "parallel"], "parallel"),
    ):
        cli_generate.build_llm(build_parser().parse_args(argv))
        assert seen["fill_mode"] == expected
