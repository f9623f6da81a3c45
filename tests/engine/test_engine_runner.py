"""Model loading and the per-slot KV-cache model runner of the reference engine (tiny-random)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from guidedec import TokenizerInfo
from guidedec.engine.batched_runner import BatchedModelRunner
from guidedec.engine.model import (
    TINY_RANDOM,
    TINY_RANDOM_DRAFT,
    LoadedModel,
    load_model,
    resolve_dtype,
)
from guidedec.engine.runner import ForwardInput, KVState, ModelRunner, SlotRunner

PROMPT = [1000 + 37 * i for i in range(10)]


@pytest.fixture(scope="module")
def model64() -> LoadedModel:
    return load_model(TINY_RANDOM, dtype="float64")


@pytest.fixture(scope="module")
def model32() -> LoadedModel:
    return load_model(TINY_RANDOM)


def _params(model: LoadedModel) -> dict[str, torch.Tensor]:
    return dict(model.model.named_parameters())


def _num_params(model: LoadedModel) -> int:
    return sum(p.numel() for p in model.model.parameters())


def _feed(
    runner: ModelRunner, slot: int, tokens: Sequence[int], num_logits: int = 1
) -> torch.Tensor:
    return runner.forward([ForwardInput(slot, tokens, num_logits)])


def _static_runner(model: LoadedModel, *, max_num_seqs: int) -> BatchedModelRunner:
    return BatchedModelRunner(model, max_num_seqs=max_num_seqs, static=True)


# --- load_model ---------------------------------------------------------------------------------


def test_same_seed_gives_bit_identical_weights_and_leaves_global_rng_alone(
    model32: LoadedModel,
) -> None:
    rng_before = torch.get_rng_state()
    again = load_model(TINY_RANDOM, seed=0)
    assert torch.equal(torch.get_rng_state(), rng_before)
    first, second = _params(model32), _params(again)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_different_seed_gives_different_weights(model32: LoadedModel) -> None:
    other = _params(load_model(TINY_RANDOM, seed=1))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(_params(model32)[name], other[name])
    assert not torch.equal(_params(model32)["lm_head.weight"], other["lm_head.weight"])


def test_float64_model_holds_the_float32_weights_cast(
    model32: LoadedModel, model64: LoadedModel
) -> None:
    assert model64.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in model64.model.parameters())
    weights32, weights64 = _params(model32), _params(model64)
    assert all(torch.equal(weights32[k].double(), weights64[k]) for k in weights32)


def test_tiny_models_shapes_vocab_and_tokenizer(model32: LoadedModel) -> None:
    draft = load_model(TINY_RANDOM_DRAFT)
    assert 20_000_000 <= _num_params(model32) <= 40_000_000
    assert _num_params(draft) < _num_params(model32)
    default = TokenizerInfo.default()
    for loaded in (model32, draft):
        assert loaded.tokenizer is default
        assert loaded.model.get_output_embeddings().weight.shape[0] == 129_280
        assert loaded.tokenizer.vocab_size == 129_280
        assert loaded.max_model_len == 4096
        assert loaded.device == torch.device("cpu")
        assert not loaded.model.training
    lm_head, draft_head = _params(model32)["lm_head.weight"], _params(draft)["lm_head.weight"]
    assert not torch.equal(lm_head[:, :64], draft_head)  # seeded apart, not the same stream


def test_greedy_decoding_of_random_weights_does_not_repeat_one_token(
    model32: LoadedModel,
) -> None:
    runner = ModelRunner(model32, max_num_seqs=1)
    token = int(_feed(runner, 0, PROMPT).argmax())
    generated = [token]
    for _ in range(15):
        token = int(_feed(runner, 0, [token]).argmax())
        generated.append(token)
    assert len(set(generated)) > 3


@pytest.mark.parametrize(
    ("spec", "expected"),
    [(None, torch.float32), ("float64", torch.float64), ("bfloat16", torch.bfloat16)],
)
def test_resolve_dtype_accepts_names(spec: str | None, expected: torch.dtype) -> None:
    assert resolve_dtype(spec) == expected
    assert resolve_dtype(expected) == expected


@pytest.mark.parametrize("spec", ["int32", "no_such_dtype", torch.int64])
def test_resolve_dtype_rejects_non_float(spec: str | torch.dtype) -> None:
    with pytest.raises(ValueError, match="not a floating-point torch dtype"):
        resolve_dtype(spec)


def test_local_folder_load_gives_the_same_logits(model32: LoadedModel, tmp_path: Path) -> None:
    model32.model.save_pretrained(tmp_path)
    model32.tokenizer.hf_tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.tokenizer.vocab_size == 129_280
    assert loaded.tokenizer.stop_token_ids == (1,)
    assert loaded.max_model_len == 4096
    expected = _feed(ModelRunner(model32, max_num_seqs=1), 0, PROMPT, num_logits=3)
    actual = _feed(ModelRunner(loaded, max_num_seqs=1), 0, PROMPT, num_logits=3)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))


def test_unknown_model_offline_raises_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'no-such-org/no-such-model' could not be loaded"):
        load_model("no-such-org/no-such-model")


# --- ModelRunner: exactness ---------------------------------------------------------------------


def test_chunked_prefill_equals_one_shot_prefill(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=2)
    one_shot = _feed(runner, 0, PROMPT)
    for start in range(0, len(PROMPT), 3):
        chunked = _feed(runner, 1, PROMPT[start : start + 3])
    assert runner.num_cached(0) == runner.num_cached(1) == len(PROMPT)
    torch.testing.assert_close(chunked, one_shot, rtol=0, atol=1e-10)
    assert int(chunked.argmax()) == int(one_shot.argmax())


def test_num_logits_returns_the_last_positions_in_order(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=2)
    block = _feed(runner, 0, PROMPT, num_logits=4)
    one_at_a_time = torch.cat([_feed(runner, 1, [t]) for t in PROMPT])
    assert block.shape == (4, 129_280)
    assert block.dtype == torch.float64
    torch.testing.assert_close(block, one_at_a_time[-4:], rtol=0, atol=1e-10)
    torch.testing.assert_close(_feed(runner, 0, PROMPT[:1]), _feed(runner, 1, PROMPT[:1]))


def test_two_slots_in_one_call_equal_each_slot_alone(model64: LoadedModel) -> None:
    together = ModelRunner(model64, max_num_seqs=2)
    rows = together.forward([ForwardInput(1, PROMPT[:4], 2), ForwardInput(0, PROMPT, 1)])
    alone = ModelRunner(model64, max_num_seqs=2)
    first = _feed(alone, 1, PROMPT[:4], num_logits=2)
    second = _feed(alone, 0, PROMPT)
    assert torch.equal(rows, torch.cat([first, second]))
    assert together.num_cached(1) == 4 and together.num_cached(0) == len(PROMPT)


def test_crop_then_replay_gives_the_uncropped_logits(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=1)
    expected = _feed(runner, 0, PROMPT, num_logits=4)
    runner.crop(0, 6)
    assert runner.num_cached(0) == 6
    replayed = _feed(runner, 0, PROMPT[6:], num_logits=4)
    torch.testing.assert_close(replayed, expected, rtol=0, atol=1e-10)
    runner.crop(0, 0)
    torch.testing.assert_close(_feed(runner, 0, PROMPT, num_logits=4), expected)


def test_crop_after_rejected_drafts_continues_as_if_never_fed(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=2)
    _feed(runner, 0, PROMPT[:6])
    _feed(runner, 0, [5, 6, 7], num_logits=3)  # drafts that get rejected
    runner.crop(0, 6)
    reference = _feed(runner, 1, PROMPT)
    torch.testing.assert_close(_feed(runner, 0, PROMPT[6:]), reference, rtol=0, atol=1e-10)


def test_exported_cache_continues_on_another_runner_and_slot(model64: LoadedModel) -> None:
    source = ModelRunner(model64, max_num_seqs=2)
    _feed(source, 0, PROMPT[:7])
    state = source.export_cache(0)
    assert state.length == 7 and len(state.keys) == 4
    expected = _feed(source, 0, PROMPT[7:], num_logits=3)  # the source moves on; state must not
    target = ModelRunner(model64, max_num_seqs=3)
    target.import_cache(2, state)
    assert target.num_cached(2) == 7
    assert torch.equal(_feed(target, 2, PROMPT[7:], num_logits=3), expected)
    assert state.keys[0].shape[-2] == 7


def test_free_empties_the_slot(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=1)
    fresh = _feed(runner, 0, PROMPT)
    runner.free(0)
    assert runner.num_cached(0) == 0
    assert runner.export_cache(0).length == 0
    assert torch.equal(_feed(runner, 0, PROMPT), fresh)


# --- ModelRunner: errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([ForwardInput(2, [1])], r"slot 2 is out of range \[0, 2\)"),
        ([ForwardInput(-1, [1])], r"slot -1 is out of range"),
        ([ForwardInput(0, [])], r"slot 0: token_ids is empty"),
        ([ForwardInput(0, [1, 2], num_logits=3)], r"num_logits=3 is outside \[1, 2\]"),
        ([ForwardInput(0, [1], num_logits=0)], r"num_logits=0 is outside \[1, 1\]"),
        ([ForwardInput(0, [129_280])], r"token ids \[129280\] outside \[0, 129280\)"),
        ([ForwardInput(1, [1]), ForwardInput(1, [2])], r"slot appears more than once"),
        ([ForwardInput(1, [1] * 4097)], r"slot 1: 0 cached \+ 4097 new .* max_model_len=4096"),
    ],
)
@pytest.mark.parametrize("make_runner", [ModelRunner, BatchedModelRunner, _static_runner])
def test_invalid_forward_raises_and_runs_nothing(
    model64: LoadedModel,
    make_runner: Callable[..., SlotRunner],
    inputs: list[ForwardInput],
    message: str,
) -> None:
    """Every runner (per sequence, batched, batched static) checks its inputs alike."""
    runner = make_runner(model64, max_num_seqs=2)
    valid = ForwardInput(1 if inputs[0].slot == 0 else 0, [1])  # must not run either
    with pytest.raises(ValueError, match=message):
        runner.forward([valid, *inputs])
    assert runner.num_cached(0) == runner.num_cached(1) == 0


def test_sequence_growing_past_max_model_len_is_refused(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=1)
    runner.import_cache(0, _fake_state(model64, 4095))
    with pytest.raises(ValueError, match=r"4095 cached \+ 2 new tokens = 4097 exceeds"):
        _feed(runner, 0, [1, 2])
    assert runner.num_cached(0) == 4095


def test_crop_past_the_cached_length_raises(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=1)
    _feed(runner, 0, PROMPT[:3])
    for bad in (4, -1):
        with pytest.raises(ValueError, match=rf"cannot crop slot 0 to {bad} tokens: it holds 3"):
            runner.crop(0, bad)
    assert runner.num_cached(0) == 3


def test_import_rejects_a_state_of_another_dtype_or_depth(model64: LoadedModel) -> None:
    runner = ModelRunner(model64, max_num_seqs=1)
    state = _fake_state(model64, 3)
    as_float32 = KVState(tuple(k.float() for k in state.keys), state.values, 3)
    with pytest.raises(ValueError, match="does not match length 3 and model dtype"):
        runner.import_cache(0, as_float32)
    with pytest.raises(ValueError, match=r"KV state has \(2, 2\) key/value layers; .* has 4"):
        runner.import_cache(0, KVState(state.keys[:2], state.values[:2], 3))


def test_max_num_seqs_must_be_positive(model64: LoadedModel) -> None:
    with pytest.raises(ValueError, match="max_num_seqs must be at least 1, got 0"):
        ModelRunner(model64, max_num_seqs=0)


def _fake_state(model: LoadedModel, length: int) -> KVState:
    """A KV state of ``length`` zero keys and values with the tiny model's layer shapes."""
    config = model.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    shape = (1, config.num_key_value_heads, length, head_dim)
    zeros = tuple(torch.zeros(shape, dtype=model.dtype) for _ in range(config.num_hidden_layers))
    return KVState(zeros, zeros, length)
