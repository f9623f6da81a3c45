"""The engine's sampling layer and n-gram drafter: parameters, the processed distribution, sampling,
speculative verification (greedy and rejection sampling) and prompt lookup."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from guidedec.engine.ngram import NgramDrafter
from guidedec.engine.sampling import (
    SamplingParams,
    greedy_tokens,
    make_generator,
    processed_probs,
    sample,
)
from guidedec.engine.verification import (
    TargetRows,
    verify_greedy,
    verify_greedy_tokens,
    verify_rejection,
)

INF = float("inf")
DTYPES = [torch.float32, torch.float64]
# chi-square critical value for 5 degrees of freedom at p = 1e-4 (a fixed seed makes it exact)
CHI2_LIMIT = 25.7


def chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    """Pearson's statistic of the token counts against ``probs`` (zero-probability tokens must
    never occur)."""
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    expected = probs.double() * len(tokens)
    assert torch.all(counts[expected == 0] == 0)
    live = expected > 0
    return float((((counts - expected) ** 2)[live] / expected[live]).sum())


def random_distribution(generator: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Rows of random probabilities, each with a random token (never all) forbidden."""
    logits = torch.randn(rows, vocab, generator=generator, dtype=torch.float64) * 1.5
    forbidden = torch.randint(0, vocab, (rows,), generator=generator)
    logits[torch.arange(rows), forbidden] = -INF
    return torch.softmax(logits, dim=-1)


# SamplingParams -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": INF}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop_token_ids": [1, -2]}, "stop_token_ids"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"stop_token_ids": "12"}, "stop_token_ids"),
        ({"stop_token_ids": 7}, "stop_token_ids"),
    ],
)
def test_sampling_params_rejects_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sampling_params_normalises_stop_ids_and_is_frozen() -> None:
    params = SamplingParams(stop_token_ids=[3, 1, 3], temperature=0.5)  # type: ignore[arg-type]
    assert params.stop_token_ids == (3, 1, 3)
    assert isinstance(params.stop_token_ids, tuple)
    assert SamplingParams(stop_token_ids=range(2)).stop_token_ids == (0, 1)  # type: ignore[arg-type]
    assert SamplingParams().stop_token_ids is None
    assert not params.is_greedy
    assert SamplingParams().is_greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        SamplingParams(0.5)  # type: ignore[misc]  # keyword-only


def test_make_generator() -> None:
    assert make_generator(SamplingParams()) is None
    seeded = SamplingParams(temperature=1.0, seed=7)
    a, b = make_generator(seeded), make_generator(seeded)
    assert a is not None and b is not None
    assert torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=b))
    c, d = (
        make_generator(SamplingParams(temperature=1.0)),
        make_generator(SamplingParams(temperature=1.0)),
    )
    assert c is not None and d is not None
    assert not torch.equal(torch.rand(8, generator=c), torch.rand(8, generator=d))


# processed_probs ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_processed_probs_masks_and_normalises(dtype: torch.dtype) -> None:
    logits = torch.tensor([[2.0, -INF, 0.5, 1.0, -INF], [-INF, 3.0, 3.0, -INF, -1.0]], dtype=dtype)
    before = logits.clone()
    for params in [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.3, top_k=2),
        SamplingParams(temperature=2.0, top_p=0.5),
        SamplingParams(temperature=1e-30),  # tiny temperature: no overflow to NaN
    ]:
        probs = processed_probs(logits, params)
        assert probs.dtype == dtype
        assert torch.all(probs[logits == -INF] == 0)
        assert torch.allclose(probs.sum(dim=-1), torch.ones(2, dtype=dtype))
    assert torch.equal(logits, before)
    plain = processed_probs(logits, SamplingParams(temperature=2.0))
    assert torch.allclose(plain, torch.softmax(logits / 2.0, dim=-1))


def test_processed_probs_greedy_is_one_hot_at_lowest_argmax() -> None:
    logits = torch.tensor([[0.0, 5.0, 5.0, -INF], [-INF, -INF, -INF, -3.0]])
    expected = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert torch.equal(processed_probs(logits, SamplingParams(top_k=1, top_p=0.1)), expected)


def test_processed_probs_top_k_keeps_exactly_k() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=generator)
    logits[:, :10] = -INF
    for k in (1, 3, 17, 40, 60):
        probs = processed_probs(logits, SamplingParams(temperature=1.0, top_k=k))
        kept = probs > 0
        assert torch.all(kept.sum(dim=-1) == min(k, 40))
        top = logits.topk(min(k, 40), dim=-1).indices
        assert torch.all(kept.gather(1, top))
        assert torch.allclose(probs.sum(dim=-1), torch.ones(6))


def brute_force_nucleus(probs: list[float], top_p: float) -> set[int]:
    """The smallest most-likely set reaching ``top_p``, plus the tokens tied with its last."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    mass, last = 0.0, probs[order[0]]
    for i in order:
        if mass >= top_p:
            break
        mass, last = mass + probs[i], probs[i]
    return {i for i, p in enumerate(probs) if p > 0 and p >= last}


@settings(max_examples=150, deadline=None)
@given(
    logits=st.lists(
        st.one_of(st.just(-INF), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=8
    ).filter(lambda xs: any(x > -INF for x in xs)),
    top_p=st.floats(0.01, 1.0),
    temperature=st.floats(0.2, 3.0),
)
def test_processed_probs_top_p_is_the_smallest_nucleus(
    logits: list[float], top_p: float, temperature: float
) -> None:
    row = torch.tensor([logits], dtype=torch.float64)
    plain = processed_probs(row, SamplingParams(temperature=temperature))[0].tolist()
    partial = 0.0
    for p in sorted(plain, reverse=True):
        partial += p
        assume(abs(partial - top_p) > 1e-9)  # no knife-edge rounding cases
    probs = processed_probs(row, SamplingParams(temperature=temperature, top_p=top_p))[0]
    kept = {i for i, p in enumerate(probs.tolist()) if p > 0}
    assert kept == brute_force_nucleus(plain, top_p)
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-12)
    mass = sum(plain[i] for i in kept)
    assert torch.allclose(probs, torch.tensor([plain], dtype=torch.float64) / mass * (probs > 0))


def test_processed_probs_top_p_after_top_k_uses_the_renormalised_mass() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64))
    # top-2 renormalises to (4/7, 3/7): top_p = 0.5 then keeps one token, 0.6 keeps both.
    one = processed_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    assert one.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    two = processed_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.6))
    assert torch.allclose(two, torch.tensor([[4 / 7, 3 / 7, 0, 0]], dtype=torch.float64))


def test_processed_probs_rejects_bad_logits() -> None:
    params = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        processed_probs(torch.tensor([[0.0, -INF], [-INF, -INF]]), params)
    with pytest.raises(ValueError, match="NaN"):
        processed_probs(torch.tensor([[0.0, math.nan]]), params)
    with pytest.raises(ValueError, match="float tensor"):
        processed_probs(torch.zeros(3), params)
    with pytest.raises(ValueError, match="float tensor"):
        processed_probs(torch.zeros(2, 0), params)
    with pytest.raises(ValueError, match="float tensor"):
        processed_probs(torch.zeros(2, 3, dtype=torch.long), params)
    assert processed_probs(torch.zeros(0, 3), params).shape == (0, 3)


# sample ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_greedy_is_argmax(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 1000, generator=generator, dtype=dtype)
    logits[2, 7] = logits[2, 9] = 100.0  # tie: lowest id
    tokens = sample(logits, [SamplingParams()] * 5, [None] * 5)
    assert tokens == logits.argmax(dim=-1).tolist()
    assert tokens[2] == 7


def test_sample_seeds_are_reproducible_and_per_row() -> None:
    logits = torch.zeros(4, 10_000)

    def draw(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, seed=seed)
        generators = [make_generator(params) for _ in range(4)]
        return [t for _ in range(5) for t in sample(logits, [params] * 4, generators)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    mixed = [SamplingParams(), SamplingParams(temperature=1.0, seed=3)]
    tokens = sample(logits[:2] + torch.arange(10_000.0), mixed, [None, make_generator(mixed[1])])
    assert tokens[0] == 9_999


@settings(max_examples=60, deadline=None)
@given(
    allowed=st.lists(st.booleans(), min_size=1, max_size=40).filter(any),
    seed=st.integers(0, 2**32),
    temperature=st.floats(0.05, 5.0),
    top_k=st.integers(0, 6),
    top_p=st.floats(0.05, 1.0),
    dtype=st.sampled_from(DTYPES),
)
def test_sample_never_returns_a_forbidden_token(
    allowed: list[bool], seed: int, temperature: float, top_k: int, top_p: float, dtype: torch.dtype
) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(1, len(allowed), generator=generator) * 4).to(dtype)
    logits[0, ~torch.tensor(allowed)] = -INF
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for _ in range(30):
        assert allowed[sample(logits, [params], [generator])[0]]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, seed=11),
        SamplingParams(temperature=1.5, top_k=3, top_p=0.9, seed=12),
    ],
)
def test_sample_follows_processed_probs(params: SamplingParams) -> None:
    logits = torch.tensor([[1.0, -INF, 0.2, 2.0, -0.5, 1.3]])
    generator = make_generator(params)
    tokens = [sample(logits, [params], [generator])[0] for _ in range(20_000)]
    assert chi_square(tokens, processed_probs(logits, params)[0]) < CHI2_LIMIT


def test_sample_rejects_dead_rows_and_mismatched_arguments() -> None:
    params = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="no allowed token"):
        sample(torch.tensor([[0.0, 1.0], [-INF, -INF]]), [params] * 2, [generator] * 2)
    with pytest.raises(ValueError, match="no allowed token"):
        sample(torch.full((1, 3), -INF), [SamplingParams()], [None])
    with pytest.raises(ValueError, match="generators"):
        sample(torch.zeros(2, 3), [params] * 2, [generator])
    with pytest.raises(ValueError, match="no generator"):
        sample(torch.zeros(1, 3), [params], [None])


# verify_greedy --------------------------------------------------------------------------------


def one_hot_logits(best: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.zeros(len(best), vocab)
    logits[torch.arange(len(best)), torch.tensor(best)] = 1.0
    return logits


def test_verify_greedy() -> None:
    assert verify_greedy(one_hot_logits([3, 1, 4, 5]), [3, 1, 4]) == (3, 5)
    assert verify_greedy(one_hot_logits([3, 1, 4, 5]), [2, 1, 4]) == (0, 3)
    assert verify_greedy(one_hot_logits([3, 1, 4, 5]), [3, 1, 0]) == (2, 4)
    assert verify_greedy(one_hot_logits([2]), []) == (0, 2)
    # rows after the first mismatch are not read, even when they have no allowed token
    logits = one_hot_logits([3, 1, 0])
    logits[1:] = -INF
    assert verify_greedy(logits, [2, 2]) == (0, 3)
    with pytest.raises(ValueError, match="no allowed token"):
        verify_greedy(torch.full((2, 4), -INF), [0])
    with pytest.raises(ValueError, match="rows"):
        verify_greedy(one_hot_logits([1, 2]), [1, 2])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(
            st.sampled_from([-INF, INF, math.nan, -1.5, 0.0, 0.0, 2.0, 7.25]),
            min_size=1,
            max_size=9,
        ).map(tuple),
        min_size=1,
        max_size=6,
    ).filter(lambda rows: len({len(r) for r in rows}) == 1),
    dtype=st.sampled_from(DTYPES),
)
def test_greedy_tokens_equal_checked_argmax_row_by_row(
    rows: list[tuple[float, ...]], dtype: torch.dtype
) -> None:
    """The one-pass pick agrees with sample's checks and argmax on every row: a token where
    sample would return one, None where it refuses the row."""
    logits = torch.tensor(rows, dtype=dtype)
    best = greedy_tokens(logits)
    for i, token in enumerate(best):
        row = logits[i : i + 1]
        try:
            expected: int | None = sample(row, [SamplingParams(temperature=0)], [None])[0]
        except ValueError:
            expected = None
        assert token == expected, (rows[i], token, expected)


def test_verify_greedy_tokens_equals_verify_greedy_on_logits() -> None:
    for best, drafts in (([3, 1, 4, 5], [3, 1, 4]), ([3, 1, 4, 5], [2, 1, 4]), ([2], [])):
        logits = one_hot_logits(best)
        assert verify_greedy_tokens(greedy_tokens(logits), drafts) == verify_greedy(logits, drafts)
    assert verify_greedy_tokens([3, None, None], [2, 2]) == (0, 3)  # unread rows are not checked
    with pytest.raises(ValueError, match="logits row 1 has no allowed token"):
        verify_greedy_tokens([3, None], [3])
    with pytest.raises(ValueError, match="need len"):
        verify_greedy_tokens([1, 2], [1, 2])


# verify_rejection -----------------------------------------------------------------------------


def output_tokens(num_accepted: int, next_token: int, drafts: list[int]) -> list[int]:
    return [*drafts[:num_accepted], next_token]


@pytest.mark.parametrize(("vocab", "k", "seed"), [(4, 3, 0), (6, 2, 1), (5, 4, 2)])
def test_verify_rejection_preserves_the_target_distribution(vocab: int, k: int, seed: int) -> None:
    setup = torch.Generator().manual_seed(seed)
    p = random_distribution(setup, k + 1, vocab)
    q = random_distribution(setup, k, vocab)
    generator = torch.Generator().manual_seed(100 + seed)
    first, second = [], []
    all_drafts = torch.multinomial(q, 20_000, replacement=True, generator=generator).T.tolist()
    for drafts in all_drafts:
        tokens = output_tokens(*verify_rejection(p, q, drafts, generator), drafts)
        first.append(tokens[0])
        if len(tokens) > 1:
            second.append(tokens[1])
    assert chi_square(first, p[0]) < CHI2_LIMIT
    assert len(second) > 2_000
    assert chi_square(second, p[1]) < CHI2_LIMIT


@pytest.mark.parametrize("drafts", [[2, 0, 1], [0, 0, 3]])
def test_verify_rejection_with_a_deterministic_drafter(drafts: list[int]) -> None:
    p = random_distribution(torch.Generator().manual_seed(5), 4, 5).float()
    generator = torch.Generator().manual_seed(6)
    first = [
        output_tokens(*verify_rejection(p, None, drafts, generator), drafts)[0]
        for _ in range(20_000)
    ]
    assert chi_square(first, p[0]) < CHI2_LIMIT


def test_verify_rejection_accepts_everything_when_q_equals_p() -> None:
    setup = torch.Generator().manual_seed(8)
    for dtype in DTYPES:
        p = random_distribution(setup, 4, 6).to(dtype)
        for _ in range(300):
            drafts = [int(t) for t in torch.multinomial(p[:3], 1, generator=setup).flatten()]
            num_accepted, bonus = verify_rejection(p, p[:3].clone(), drafts, setup)
            assert num_accepted == 3
            assert p[3, bonus] > 0


def test_verify_rejection_edge_cases() -> None:
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    for _ in range(50):
        # a forbidden draft (p = 0) is always rejected, the replacement is never forbidden
        num_accepted, token = verify_rejection(p, None, [0], generator)
        assert num_accepted == 0 and token in (1, 2)
        # a draft outside its own support (q = 0) is rejected; residual max(0, p - q) = token 2
        assert verify_rejection(p, q, [2], generator) == (0, 2)
    # greedy targets (one-hot p) reduce to greedy verification
    one_hot = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert verify_rejection(one_hot, None, [1], generator) == (1, 2)
    assert verify_rejection(one_hot, None, [0], generator) == (0, 1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        verify_rejection(p, None, [3], generator)
    with pytest.raises(ValueError, match="draft_probs"):
        verify_rejection(p, torch.ones(2, 3) / 3, [1], generator)
    with pytest.raises(ValueError, match="target_probs"):
        verify_rejection(p, None, [1, 2], generator)


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    points=st.sets(st.integers(0, 4)),
    with_q=st.booleans(),
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_target_rows_give_verify_rejection_the_results_of_processed_probs(
    k: int, seed: int, points: set[int], with_q: bool, temperature: float
) -> None:
    """Rows read on demand, with masked one-token rows as point masses whose logits are never
    read (NaN there), give the same accepted count, token and generator state as the
    distributions :func:`processed_probs` computes for the whole chunk."""
    vocab, setup = 6, torch.Generator().manual_seed(seed)
    logits = torch.randn(k + 1, vocab, generator=setup, dtype=torch.float64)
    masses = {}
    for row in sorted(p for p in points if p <= k):
        token = int(torch.randint(vocab, (1,), generator=setup))
        logits[row] = -INF
        logits[row, token] = 0.0
        masses[row] = token
    q = random_distribution(setup, k, vocab) if with_q else None
    drafts = [int(t) for t in torch.randint(vocab, (k,), generator=setup)]
    params = SamplingParams(temperature=temperature)
    unread = logits.clone()
    for row in masses:
        unread[row] = math.nan  # a point mass's logits are not read
    for trial in range(5):
        full, lazy = (torch.Generator().manual_seed(seed + trial) for _ in range(2))
        expected = verify_rejection(processed_probs(logits, params), q, drafts, full)
        target = TargetRows(unread, params, masses)
        assert verify_rejection(target, q, drafts, lazy) == expected
        assert torch.equal(full.get_state(), lazy.get_state())


# NgramDrafter -----------------------------------------------------------------------------------


def test_ngram_finds_the_most_recent_match() -> None:
    drafter = NgramDrafter(max_ngram=1)
    assert drafter.propose([5, 1, 2, 5, 3, 4, 5], 2) == [3, 4]
    assert drafter.propose([5, 1, 2, 5, 3, 4, 5], 10) == [3, 4, 5]  # up to the end
    assert drafter.propose([5, 1, 2, 5, 3, 4, 5], 0) == []


def test_ngram_prefers_longer_ngrams() -> None:
    tokens = [1, 2, 3, 9, 8, 2, 3, 7, 6, 3, 1, 2, 3]
    assert NgramDrafter(max_ngram=3).propose(tokens, 2) == [9, 8]  # "1 2 3" at 0
    assert NgramDrafter(max_ngram=2).propose(tokens, 2) == [7, 6]  # "2 3" most recent at 5
    assert NgramDrafter(max_ngram=1).propose(tokens, 2) == [1, 2]  # "3" most recent at 9
    assert NgramDrafter(max_ngram=3, min_ngram=3).propose([4, 2, 3, 1, 2, 3], 2) == []


def test_ngram_never_matches_the_suffix_itself() -> None:
    drafter = NgramDrafter()
    assert drafter.propose([1, 2, 3], 3) == []
    assert drafter.propose([7], 3) == []
    assert drafter.propose([], 3) == []
    assert drafter.propose([4, 4, 4], 3) == [4]  # overlapping "4 4" at 0, followed by one 4
    with pytest.raises(ValueError, match="num_tokens"):
        drafter.propose([1, 1], -1)
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(min_ngram=0)


def brute_force_propose(tokens: list[int], num_tokens: int, max_n: int, min_n: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[-n:]:
                return tokens[start + n : start + n + num_tokens]
    return []


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=30),
    num_tokens=st.integers(0, 5),
    bounds=st.tuples(st.integers(1, 4), st.integers(0, 3)),
)
def test_ngram_matches_brute_force(
    tokens: list[int], num_tokens: int, bounds: tuple[int, int]
) -> None:
    min_n, extra = bounds
    drafter = NgramDrafter(max_ngram=min_n + extra, min_ngram=min_n)
    expected = brute_force_propose(tokens, num_tokens, min_n + extra, min_n)
    assert drafter.propose(tokens, num_tokens) == expected


def test_ngram_is_fast_on_long_sequences() -> None:
    tokens = torch.randint(0, 50, (4000,), generator=torch.Generator().manual_seed(0)).tolist()
    drafter = NgramDrafter(max_ngram=4)
    start = time.perf_counter()
    for _ in range(100):
        drafter.propose(tokens, 5)
    assert (time.perf_counter() - start) / 100 < 0.01


@pytest.mark.parametrize(("scale", "top_p"), [(4.0, 0.9), (0.1, 0.5), (1.0, 0.999)])
def test_processed_probs_top_p_on_a_large_vocabulary(scale: float, top_p: float) -> None:
    # Peaked rows keep the nucleus among the first candidates sorted; flat ones need a full sort.
    logits = torch.randn(2, 5000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    logits *= scale
    logits[:, ::7] = -INF
    plain = processed_probs(logits, SamplingParams(temperature=1.0))
    probs = processed_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
    for row in range(2):
        kept = set((probs[row] > 0).nonzero().flatten().tolist())
        assert kept == brute_force_nucleus(plain[row].tolist(), top_p)


@pytest.mark.parametrize(("u", "expected"), [(1.0, 1), (0.0, 2)])
def test_sample_rounding_never_lands_on_a_forbidden_token(
    monkeypatch: pytest.MonkeyPatch, u: float, expected: int
) -> None:
    # u = 1.0 stands for u * total rounding up to total: the draw falls past the last allowed
    # token and must move back to it.
    monkeypatch.setattr("guidedec.engine.sampling.uniform", lambda generator: u)
    logits = torch.tensor([[0.0, 1.0, -INF, -INF]]) if u else torch.tensor([[-INF, -INF, 0.0, 1.0]])
    params = SamplingParams(temperature=1.0)
    assert sample(logits, [params], [torch.Generator()]) == [expected]


def test_sample_rows_reads_the_named_rows_in_their_order() -> None:
    """``rows`` picks rows in place: the same tokens as sampling their copy, with the same
    generators, and the rows not named are never read (nor checked)."""
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    logits[1] = -INF  # not named: no error
    params = [SamplingParams(temperature=0.8), SamplingParams(), SamplingParams(temperature=1.3)]
    rows = [4, 0, 2]

    def generators() -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(7), None, torch.Generator().manual_seed(9)]

    expected = sample(logits[rows], params, generators())
    assert sample(logits, params, generators(), rows=rows) == expected
    assert expected[1] == int(logits[0].argmax())
    with pytest.raises(ValueError, match="logits row 1 has no allowed token"):
        sample(logits, params[:1], [None], rows=[1])
    with pytest.raises(ValueError, match="outside the 5 rows"):
        sample(logits, params[:1], generators()[:1], rows=[5])
    with pytest.raises(ValueError, match="2 rows, 3 params"):
        sample(logits, params, generators(), rows=[0, 2])


def test_sample_names_a_row_with_nan_or_inf() -> None:
    logits = torch.zeros(3, 4)
    logits[2, 1] = math.nan
    with pytest.raises(ValueError, match="row 2 contains NaN"):
        sample(logits, [SamplingParams(temperature=1.0)] * 3, [torch.Generator()] * 3)
    logits[2, 1] = INF
    with pytest.raises(ValueError, match="row 2 contains NaN or \\+inf"):
        sample(logits, [SamplingParams()] * 3, [None] * 3)
