"""Vocab-sharded (tensor-parallel) bitmask application: each rank's shard equals the same columns
of the unsharded apply, bit for bit, with and without d2t (where TensorRT-LLM's coordinates are
wrong), clear errors, and a real two-process ``torch.distributed`` run."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from guidedec import (
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingParams,
    GuidedRequest,
    TokenizerInfo,
    testing,
)
from guidedec.bitmask import apply_bitmask, apply_bitmask_sharded, vocab_shard
from guidedec.testing import bitmask_to_bool_mask, random_bitmask

DRAFT_VOCAB = 384  # 32 * 12: shards of 384, 192 and 96 columns, all word-aligned
TARGET_VOCAB = 1000  # not a multiple of 32: with d2t the target vocabulary need not align
ROWS = 5
SCHEMA = GuidedDecodingParams(
    json_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
)
REGEX = GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,4}!")
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(INT_VIEW[tensor.dtype])


def random_d2t(draft_vocab: int, target_vocab: int, seed: int) -> torch.Tensor:
    """Targets anywhere in the target vocabulary (so in other ranks' ranges), a few outside it."""
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(-8, target_vocab + 40, (draft_vocab,), generator=generator)
    return targets - torch.arange(draft_vocab)


def shard_columns(tp_size: int, tp_rank: int, vocab: int) -> slice:
    width = vocab // tp_size
    return slice(tp_rank * width, (tp_rank + 1) * width)


def reference_apply(
    logits_shard: torch.Tensor, bitmask: torch.Tensor, d2t: torch.Tensor | None, rank: int
) -> None:
    """TensorRT-LLM's ``_apply_bitmask`` coordinates: the word slice of the bitmask, and with
    d2t the token slice of d2t, whose targets are full-vocabulary positions."""
    vocab = d2t.shape[0] if d2t is not None else 32 * bitmask.shape[1]
    tp_size = vocab // logits_shard.shape[1]
    tp_rank, words = rank % tp_size, bitmask.shape[1]
    word_slice = bitmask[:, tp_rank * words // tp_size : (tp_rank + 1) * words // tp_size]
    local_d2t = None if d2t is None else d2t[shard_columns(tp_size, tp_rank, vocab)]
    apply_bitmask(logits_shard, word_slice, d2t=local_d2t, backend="torch")


def case(
    dtype: torch.dtype, with_d2t: bool, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """Logits, bitmask, d2t and the unsharded vocabulary for one random case."""
    generator = torch.Generator().manual_seed(seed)
    target_vocab = TARGET_VOCAB if with_d2t else DRAFT_VOCAB
    logits = torch.randn(ROWS, DRAFT_VOCAB, generator=generator).to(dtype)
    bitmask = random_bitmask(ROWS, target_vocab, density=0.5, generator=generator)
    d2t = random_d2t(DRAFT_VOCAB, target_vocab, seed) if with_d2t else None
    return logits, bitmask, d2t, target_vocab


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_d2t", [False, True])
@pytest.mark.parametrize("with_token_mask", [False, True])
@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_each_rank_shard_equals_its_columns_of_the_unsharded_apply_bit_for_bit(
    tp_size: int, with_token_mask: bool, with_d2t: bool, dtype: torch.dtype
) -> None:
    logits, bitmask, d2t, target_vocab = case(dtype, with_d2t)
    token_mask = torch.tensor([1, 0, 1, 1, 0], dtype=torch.int32) if with_token_mask else None
    truth = logits.clone()
    apply_bitmask(truth, bitmask, token_mask=token_mask, d2t=d2t, backend="torch")
    for tp_rank in range(tp_size):
        columns = shard_columns(tp_size, tp_rank, DRAFT_VOCAB)
        sharded = logits.clone()
        apply_bitmask_sharded(
            sharded[:, columns],  # a strided view into the full logits
            bitmask,
            token_mask=token_mask,
            d2t=d2t,
            rank=tp_rank,
            vocab_size_padded=None if with_d2t else target_vocab,
        )
        expected = logits.clone()
        expected[:, columns] = truth[:, columns]
        assert torch.equal(bits(sharded), bits(expected)), f"rank {tp_rank} of {tp_size}"


def test_tp_rank_is_the_global_rank_modulo_tp_size() -> None:
    logits, bitmask, d2t, _ = case(torch.float32, with_d2t=True)
    truth = logits.clone()
    apply_bitmask(truth, bitmask, d2t=d2t)
    shard = logits[:, 96:192].clone()  # tp_size 4, tp_rank 1
    apply_bitmask_sharded(shard, bitmask, d2t=d2t, rank=5)
    assert torch.equal(shard, truth[:, 96:192])
    assert vocab_shard(96, DRAFT_VOCAB, 12, 7, has_d2t=False).tp_rank == 3


@pytest.mark.parametrize("tp_size", [2, 4])
def test_reference_d2t_coordinates_read_wrong_bits_and_ours_do_not(tp_size: int) -> None:
    """TensorRT-LLM looks up full-vocabulary targets in a word-sliced bitmask: wrong whenever
    T > 1. Its target vocabulary here (1024 tokens, 32 words) passes its W % T assertion."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(ROWS, DRAFT_VOCAB, generator=generator)
    bitmask = random_bitmask(ROWS, 1024, density=0.5, generator=generator)
    d2t = random_d2t(DRAFT_VOCAB, 1024, seed=1)
    truth = logits.clone()
    apply_bitmask(truth, bitmask, d2t=d2t)
    reference_wrong = []
    for tp_rank in range(tp_size):
        columns = shard_columns(tp_size, tp_rank, DRAFT_VOCAB)
        ours, reference = logits[:, columns].clone(), logits[:, columns].clone()
        apply_bitmask_sharded(ours, bitmask, d2t=d2t, rank=tp_rank)
        reference_apply(reference, bitmask, d2t, tp_rank)
        assert torch.equal(ours, truth[:, columns])
        reference_wrong.append(not torch.equal(reference, truth[:, columns]))
    assert all(reference_wrong)


def test_reference_coordinates_are_right_without_d2t_or_when_unsharded() -> None:
    logits, bitmask, d2t, _ = case(torch.float32, with_d2t=False)
    truth = logits.clone()
    apply_bitmask(truth, bitmask)
    for tp_rank in range(2):
        shard = logits[:, shard_columns(2, tp_rank, DRAFT_VOCAB)].clone()
        reference_apply(shard, bitmask, None, tp_rank)
        assert torch.equal(shard, truth[:, shard_columns(2, tp_rank, DRAFT_VOCAB)])
    logits, bitmask, d2t, _ = case(torch.float32, with_d2t=True)
    truth, reference = logits.clone(), logits.clone()
    apply_bitmask(truth, bitmask, d2t=d2t)
    reference_apply(reference, bitmask, d2t, rank=3)
    assert torch.equal(reference, truth)


def test_bitmask_size_not_divisible_by_tp_size_names_both_numbers() -> None:
    # V = 96 (3 words) split in 2 shards of 48 tokens.
    with pytest.raises(ValueError, match=r"bitmask_size=3 .*tp_size=2"):
        apply_bitmask_sharded(
            torch.zeros(2, 48), torch.zeros(2, 3, dtype=torch.int32), vocab_size_padded=96
        )


def test_logits_width_that_does_not_divide_the_vocabulary_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"100 columns.*384 tokens"):
        apply_bitmask_sharded(
            torch.zeros(2, 100), torch.zeros(2, 12, dtype=torch.int32), vocab_size_padded=384
        )
    with pytest.raises(ValueError, match=r"100 columns.*384 tokens"):
        apply_bitmask_sharded(
            torch.zeros(2, 100), torch.zeros(2, 12, dtype=torch.int32), d2t=torch.zeros(384)
        )


def test_shards_that_do_not_start_on_word_boundaries_are_rejected() -> None:
    # V = 120 (4 words) in 2 shards of 60 tokens: W % T == 0 but token 60 is inside word 1.
    with pytest.raises(ValueError, match=r"tp_size=2 .*120-token.*60 tokens.*multiple of 32"):
        apply_bitmask_sharded(
            torch.zeros(2, 60), torch.zeros(2, 4, dtype=torch.int32), vocab_size_padded=120
        )
    # The same vocabulary shards fine with d2t: every rank reads the full bitmask.
    apply_bitmask_sharded(
        torch.zeros(2, 60), torch.zeros(2, 4, dtype=torch.int32), d2t=torch.zeros(120).long()
    )


def test_a_bitmask_that_does_not_cover_the_vocabulary_exactly_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"bitmask_size=16 .*384-token"):
        apply_bitmask_sharded(
            torch.zeros(2, 192), torch.zeros(2, 16, dtype=torch.int32), vocab_size_padded=384
        )


def test_a_float_d2t_is_rejected_when_sharded() -> None:
    with pytest.raises(ValueError, match="integer"):
        apply_bitmask_sharded(
            torch.zeros(2, 192), torch.zeros(2, 12, dtype=torch.int32), d2t=torch.zeros(384)
        )


def make_decoder(
    tokenizer: TokenizerInfo, factory: GrammarMatcherFactory, *, rank: int = 0
) -> GuidedDecoder:
    return testing.make_decoder(
        tokenizer, factory=factory, max_num_sequences=2, max_num_draft_tokens=1, rank=rank
    )


def test_decoder_rejects_logits_whose_width_does_not_divide_the_vocabulary(
    tokenizer: TokenizerInfo, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    decoder = make_decoder(tokenizer, make_factory("xgrammar"))
    decoder.add_batch([GuidedRequest.context(REGEX, request_id=1, seq_slot=0)])
    with pytest.raises(ValueError, match="does not divide"):
        decoder.execute(torch.zeros(1, 1000))
    with pytest.raises(ValueError, match="rank"):
        make_decoder(tokenizer, make_factory("xgrammar"), rank=-1)


def test_decoders_on_two_ranks_mask_their_shards_as_one_unsharded_decoder(
    tokenizer: TokenizerInfo, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    """A speculative step (execute with a draft row, then execute_draft_batch with d2t) on the
    shards of decoders of global ranks 2 and 3 (tp ranks 0 and 1) matches one decoder on the full
    logits."""
    factory = make_factory("xgrammar")
    full = make_decoder(tokenizer, factory)
    ranks = [make_decoder(tokenizer, factory, rank=rank) for rank in (2, 3)]
    vocab, yes = tokenizer.vocab_size, tokenizer.encode("yes-12!")
    generator = torch.Generator().manual_seed(0)
    targets = torch.randint(0, vocab, (4096,), generator=generator)
    targets[[0, 2048]] = yes[2]  # allowed after "yes-", in both shards of the draft vocabulary
    d2t = (targets - torch.arange(4096)).to(torch.int32)
    steps = [
        ([GuidedRequest.context(REGEX, request_id=1, seq_slot=0)], vocab),
        (
            [
                GuidedRequest.generation(
                    REGEX, request_id=1, seq_slot=0, new_token=yes[0], draft_tokens=[yes[1]]
                ),
                GuidedRequest.context(None, request_id=2, seq_slot=1),
            ],
            vocab,
        ),
    ]
    for requests, width in steps:
        rows = 1 if len(requests) == 1 else 3
        logits = torch.randn(rows, width, generator=generator)
        expected, sharded = logits.clone(), logits.clone()
        full.add_batch(requests)
        assert full.execute(expected) == []
        for rank, decoder in enumerate(ranks):
            decoder.add_batch(requests)
            assert decoder.execute(sharded[:, shard_columns(2, rank, width)]) == []
        assert torch.equal(sharded, expected)
    draft = torch.randn(2, 4096, generator=generator)
    expected, sharded = draft.clone(), draft.clone()
    full.add_draft_batch([yes[1], 7], [1, 1], draft_step=0)
    assert full.execute_draft_batch(expected, d2t=d2t, draft_step=0) == []
    for rank, decoder in enumerate(ranks):
        decoder.add_draft_batch([yes[1], 7], [1, 1], draft_step=0)
        shard = sharded[:, shard_columns(2, rank, 4096)]
        assert decoder.execute_draft_batch(shard, d2t=d2t, draft_step=0) == []
    assert torch.equal(sharded, expected)
    assert torch.isfinite(expected[0, [0, 2048]]).all() and torch.isinf(expected[0]).any()


# --- Two processes, torch.distributed (gloo) --------------------------------------------------

WORLD_SIZE = 2
DIST_TIMEOUT_S = 90


def _all_gather_columns(shard: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(shard) for _ in range(WORLD_SIZE)]
    dist.all_gather(parts, shard.contiguous())
    return torch.cat(parts, dim=1)


def _apply_on_my_shard(
    logits: torch.Tensor, apply: Callable[[torch.Tensor], None], rank: int
) -> torch.Tensor:
    """Apply to this rank's columns of ``logits`` and gather every rank's result."""
    shard = logits[:, shard_columns(WORLD_SIZE, rank, logits.shape[1])].clone()
    apply(shard)
    return _all_gather_columns(shard)


def _random_cases(rank: int) -> dict[str, torch.Tensor]:
    results: dict[str, torch.Tensor] = {}
    token_mask = torch.tensor([1, 1, 0, 1, 1], dtype=torch.int32)
    for with_d2t in (False, True):
        logits, bitmask, d2t, target_vocab = case(torch.float32, with_d2t, seed=3)

        def apply(shard: torch.Tensor, bitmask=bitmask, d2t=d2t, vocab=target_vocab) -> None:
            apply_bitmask_sharded(
                shard, bitmask, token_mask=token_mask, d2t=d2t, rank=rank, vocab_size_padded=vocab
            )

        name = "d2t" if with_d2t else "plain"
        results[f"{name}.gathered"] = _apply_on_my_shard(logits, apply, rank)
        apply_bitmask(logits, bitmask, token_mask=token_mask, d2t=d2t)
        results[f"{name}.expected"] = logits
    return results


def _decoder_cases(rank: int) -> dict[str, torch.Tensor]:
    tokenizer = TokenizerInfo.default()
    decoder = testing.make_decoder(tokenizer, "llguidance", max_num_sequences=2, rank=rank)
    decoder.add_batch(
        [
            GuidedRequest.context(SCHEMA, request_id=1, seq_slot=0),
            GuidedRequest.context(None, request_id=2, seq_slot=1),
        ]
    )
    assert decoder.build() == []
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(2, tokenizer.vocab_size, generator=generator)
    results = {"decoder.gathered": _apply_on_my_shard(logits, decoder.apply_bitmask, rank)}
    rows, live = decoder.bitmask[:2], decoder.token_mask[:2]
    apply_bitmask(logits, rows, token_mask=live)
    results["decoder.expected"] = logits
    # Draft logits over 4096 draft tokens; the grammar's allowed tokens sit in both shards.
    allowed = bitmask_to_bool_mask(rows[0], tokenizer.vocab_size).nonzero().flatten()
    targets = torch.randint(0, tokenizer.vocab_size, (4096,), generator=generator)
    picks = allowed[torch.arange(8) % allowed.numel()]
    targets[:8], targets[2048:2056] = picks, picks.flip(0)
    d2t = targets - torch.arange(4096)
    draft = torch.randn(2, 4096, generator=generator)

    def apply_draft(shard: torch.Tensor) -> None:
        decoder.apply_bitmask(shard, d2t=d2t)

    results["decoder_d2t.gathered"] = _apply_on_my_shard(draft, apply_draft, rank)
    apply_bitmask(draft, rows, token_mask=live, d2t=d2t)
    results["decoder_d2t.expected"] = draft
    return results


def _distributed_worker(rank: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(out_dir, 'rendezvous')}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=DIST_TIMEOUT_S),
    )
    try:
        results = _random_cases(rank) | _decoder_cases(rank)
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "results.pt"))
    finally:
        dist.destroy_process_group()


def run_two_ranks(out_dir: Path) -> None:
    context = mp.start_processes(
        _distributed_worker,
        args=(str(out_dir),),
        nprocs=WORLD_SIZE,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + DIST_TIMEOUT_S
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the two ranks did not finish in {DIST_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)


def test_two_gloo_ranks_gather_to_the_unsharded_apply(tmp_path: Path) -> None:
    run_two_ranks(tmp_path)
    results = torch.load(tmp_path / "results.pt")
    names = ("plain", "d2t", "decoder", "decoder_d2t")
    for name in names:
        gathered, expected = results[f"{name}.gathered"], results[f"{name}.expected"]
        assert torch.equal(gathered, expected), name
        half = expected.shape[1] // 2
        for part in (expected[:, :half], expected[:, half:]):  # both ranks masked and kept some
            assert torch.isinf(part).any() and torch.isfinite(part).any(), name
    guided = results["decoder_d2t.expected"][0]
    assert torch.isfinite(guided[:8]).all() and torch.isfinite(guided[2048:2056]).all()
