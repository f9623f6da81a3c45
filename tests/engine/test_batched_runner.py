"""The batched runner (one packed forward per call) against ModelRunner (one batch-1 forward per
sequence) as the oracle: random mixes of joins, leaves, prefill chunks next to decodes and
verification chunks with crops, in float64 (same logits to ~1e-12, same greedy tokens) and
float32 (within the measured 1e-6 of summation-order differences); the slot cache growing;
the attention switch; refusals."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guidedec.engine.batched_runner import BatchedModelRunner, pack_inputs
from guidedec.engine.model import TINY_RANDOM, LoadedModel, load_model
from guidedec.engine.runner import ForwardInput, ModelRunner
from guidedec.engine.slot_attention import SLOT_ATTENTION, slot_attention
from guidedec.engine.slot_cache import INITIAL_CAPACITY

SLOTS = 4
# float32: batched matrix products and attention over a padded key range sum in another order;
# measured at most 7.7e-7 over 60 random mixed steps of 8 slots. float64: about 1e-15.
ATOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def _step_inputs(rng: random.Random, lengths: list[int]) -> list[ForwardInput]:
    """A step over a random subset of slots: empty slots join with a prompt chunk, others feed
    one token (decode), a verification chunk (1 + k tokens, k + 1 logits) or a prefill chunk."""
    inputs = []
    for slot in rng.sample(range(SLOTS), rng.randint(1, SLOTS)):
        n = rng.choice([1, 1, 2, 4, 7]) if lengths[slot] else rng.randint(1, 12)
        tokens = [rng.randrange(129_280) for _ in range(n)]
        inputs.append(ForwardInput(slot, tokens, rng.choice([1, n])))
    return inputs


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1))
def test_batched_runner_matches_per_sequence_runner_on_random_step_mixes(
    model: LoadedModel, seed: int
) -> None:
    rng = random.Random(seed)
    oracle = ModelRunner(model, max_num_seqs=SLOTS)
    batched = BatchedModelRunner(model, max_num_seqs=SLOTS)
    for _ in range(8):
        lengths = [oracle.num_cached(s) for s in range(SLOTS)]
        inputs = _step_inputs(rng, lengths)
        expected, actual = oracle.forward(inputs), batched.forward(inputs)
        torch.testing.assert_close(actual, expected, rtol=0, atol=ATOL[model.dtype])
        if model.dtype == torch.float64:
            assert torch.equal(actual.argmax(dim=-1), expected.argmax(dim=-1))
        for item in inputs:  # rejected drafts are cropped; some sequences leave
            action = rng.random()
            if action < 0.2:
                oracle.free(item.slot)
                batched.free(item.slot)
            elif action < 0.5 and len(item.token_ids) > 1:
                keep = oracle.num_cached(item.slot) - rng.randint(1, len(item.token_ids) - 1)
                oracle.crop(item.slot, keep)
                batched.crop(item.slot, keep)
        assert [batched.num_cached(s) for s in range(SLOTS)] == [
            oracle.num_cached(s) for s in range(SLOTS)
        ]


def test_greedy_decoding_of_a_batch_equals_each_sequence_decoded_alone(
    model64: LoadedModel,
) -> None:
    """Four sequences decoded together for 24 steps give the tokens each gives on its own."""
    prompts = [[1000 + 37 * i + s for i in range(5 + 3 * s)] for s in range(SLOTS)]

    def decode(runner: Any, slots: list[int]) -> list[list[int]]:
        logits = runner.forward([ForwardInput(s, prompts[s]) for s in slots])
        tokens = [[int(t)] for t in logits.argmax(dim=-1)]
        for _ in range(24):
            logits = runner.forward(
                [ForwardInput(s, [t[-1]]) for s, t in zip(slots, tokens, strict=True)]
            )
            for row, t in zip(logits.argmax(dim=-1).tolist(), tokens, strict=True):
                t.append(row)
        return tokens

    together = decode(BatchedModelRunner(model64, max_num_seqs=SLOTS), list(range(SLOTS)))
    alone = [decode(ModelRunner(model64, max_num_seqs=SLOTS), [s])[0] for s in range(SLOTS)]
    assert together == alone


def test_the_slot_cache_grows_past_its_first_capacity_and_keeps_what_it_holds(
    model64: LoadedModel,
) -> None:
    oracle = ModelRunner(model64, max_num_seqs=2)
    batched = BatchedModelRunner(model64, max_num_seqs=2)
    assert batched.cache.capacity == INITIAL_CAPACITY
    chunk = [7 + i for i in range(100)]
    for step in range(3):  # slot 0 grows to 300 positions while slot 1 decodes
        inputs = [ForwardInput(0, chunk), ForwardInput(1, [11 + step])]
        torch.testing.assert_close(
            batched.forward(inputs), oracle.forward(inputs), rtol=0, atol=1e-12
        )
    assert batched.cache.capacity == 2 * INITIAL_CAPACITY
    inputs = [ForwardInput(0, [3], 1), ForwardInput(1, [5, 6], 2)]
    torch.testing.assert_close(batched.forward(inputs), oracle.forward(inputs), rtol=0, atol=1e-12)


def test_pack_inputs_groups_by_query_length_and_keeps_the_requested_logits(
    model64: LoadedModel,
) -> None:
    inputs = [ForwardInput(2, [5, 6, 7], 2), ForwardInput(0, [8]), ForwardInput(1, [1, 2, 3], 1)]
    batch = pack_inputs(inputs, [4, 9, 0], device=torch.device("cpu"), dtype=torch.float64)
    assert batch.token_ids.tolist() == [[5, 6, 7, 8, 1, 2, 3]]
    assert batch.positions.tolist() == [[4, 5, 6, 9, 0, 1, 2]]
    assert batch.slots.tolist() == [2, 2, 2, 0, 1, 1, 1]
    assert batch.logits_index.tolist() == [1, 2, 3, 6]
    three, one = batch.groups
    assert three.slots.tolist() == [2, 1] and three.token_index.tolist() == [[0, 1, 2], [4, 5, 6]]
    assert three.key_length == 7 and one.slots.tolist() == [0] and one.key_length == 10
    visible = three.mask[1, 0] == 0  # slot 1's queries at positions 0, 1, 2
    assert visible[:, :3].tolist() == [[True, False, False], [True, True, False], [True] * 3]
    assert not visible[:, 3:].any()


def test_slot_attention_is_switched_on_for_one_forward_only(model64: LoadedModel) -> None:
    config = model64.model.config
    assert config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"), slot_attention(model64.model):
        assert config._attn_implementation == SLOT_ATTENTION
        raise RuntimeError("inside")
    assert config._attn_implementation == "sdpa"
    with slot_attention(model64.model), pytest.raises(ValueError, match="needs slot_groups"):
        model64.model(input_ids=torch.tensor([[1, 2]]))  # no SlotCache forward
    runner = BatchedModelRunner(model64, max_num_seqs=1)
    runner.forward([ForwardInput(0, [1, 2, 3])])
    assert config._attn_implementation == "sdpa"


def test_a_sliding_window_model_is_refused() -> None:
    config = transformers.MistralConfig(
        vocab_size=129_280,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        sliding_window=16,
    )
    loaded = LoadedModel(
        "mistral",
        transformers.MistralForCausalLM(config).eval(),
        load_model(TINY_RANDOM).tokenizer,
        64,
        torch.device("cpu"),
        torch.float32,
    )
    with pytest.raises(ValueError, match="needs full-attention layers only"):
        BatchedModelRunner(loaded, max_num_seqs=1)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1))
def test_rows_without_logits_are_zeros_and_the_others_unchanged(
    model64: LoadedModel, seed: int
) -> None:
    """``no_logits`` rows come back as zeros; every other row is the one a full forward gives,
    and the KV caches stay the same (the positions are fed all the same)."""
    rng = random.Random(seed)
    full = BatchedModelRunner(model64, max_num_seqs=SLOTS)
    skipping = BatchedModelRunner(model64, max_num_seqs=SLOTS)
    for _ in range(4):
        inputs = _step_inputs(rng, [full.num_cached(s) for s in range(SLOTS)])
        skipped = [
            ForwardInput(
                i.slot,
                i.token_ids,
                i.num_logits,
                tuple(j for j in range(i.num_logits) if rng.random() < 0.5),
            )
            for i in inputs
        ]
        expected, actual = full.forward(inputs), skipping.forward(skipped)
        row = 0
        for item in skipped:
            for j in range(item.num_logits):
                if j in item.no_logits:
                    assert not actual[row + j].any()
                else:
                    torch.testing.assert_close(
                        actual[row + j], expected[row + j], rtol=0, atol=1e-12
                    )
            row += item.num_logits
    for slot in range(SLOTS):
        assert full.num_cached(slot) == skipping.num_cached(slot)
    with pytest.raises(ValueError, match="no_logits"):
        full.forward([ForwardInput(0, [1, 2], 2, (2,))])


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1))
def test_sparse_logits_rows_are_exact_at_their_columns_and_zeros_elsewhere(
    model64: LoadedModel, seed: int
) -> None:
    """A ``sparse_logits`` row is the full forward's row at its columns (the lm_head of those
    columns alone) and zeros elsewhere; rows without logits and full rows are as before."""
    rng = random.Random(seed)
    full = BatchedModelRunner(model64, max_num_seqs=SLOTS)
    sparse = BatchedModelRunner(model64, max_num_seqs=SLOTS)
    vocab = full.vocab_size
    for _ in range(4):
        inputs = _step_inputs(rng, [full.num_cached(s) for s in range(SLOTS)])
        asked = []
        for i in inputs:
            rows = list(range(i.num_logits))
            rng.shuffle(rows)
            skip = tuple(rows[: rng.randint(0, len(rows) // 2)])
            few = tuple(
                (j, tuple(sorted(rng.sample(range(vocab), rng.randint(1, 40)))))
                for j in rows[len(skip) :]
                if rng.random() < 0.6
            )
            asked.append(ForwardInput(i.slot, i.token_ids, i.num_logits, skip, few))
        expected, actual = full.forward(inputs), sparse.forward(asked)
        row = 0
        for item in asked:
            columns = dict(item.sparse_logits)
            for j in range(item.num_logits):
                got, want = actual[row + j], expected[row + j]
                if j in item.no_logits:
                    assert not got.any()
                elif j in columns:
                    ids = torch.tensor(columns[j])
                    torch.testing.assert_close(got[ids], want[ids], rtol=0, atol=1e-12)
                    rest = torch.ones(vocab, dtype=torch.bool)
                    rest[ids] = False
                    assert not got[rest].any()
                else:
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            row += item.num_logits
    with pytest.raises(ValueError, match="sparse_logits rows"):
        full.forward([ForwardInput(0, [1, 2], 2, (1,), ((1, (3,)),))])
    with pytest.raises(ValueError, match="sparse_logits token outside"):
        full.forward([ForwardInput(0, [1, 2], 2, (), ((1, (vocab,)),))])
