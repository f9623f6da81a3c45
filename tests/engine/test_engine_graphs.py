"""CUDA graphs in the reference engine, checked on the CPU where no graph exists: the batched
runner's static cache against ModelRunner (logits, crop, export/import, errors, no host reads of
device values in a decode forward), the CPU StepGraph and the LRU of padded-size decode graphs,
the guided replay taking exactly one queued snapshot, and LLM(cuda_graphs=True) against the
eager engine token for token. The `gpu` tests capture real graphs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from guidedec import (
    LLM,
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    GuidedRequest,
    SamplingParams,
)
from guidedec.cli import build_parser
from guidedec.decoder.capturable import CapturableGuidedDecoder
from guidedec.engine.batched_runner import BatchedModelRunner
from guidedec.engine.graphs import (
    DecodeGraphs,
    HostStepGraph,
    decode_batch,
    is_decode_step,
    padded_size,
)
from guidedec.engine.model import TINY_RANDOM, LoadedModel, load_model
from guidedec.engine.runner import ForwardInput, KVState, ModelRunner, SlotRunner
from guidedec.grammar.matcher import REJECTED
from guidedec.testing import bitmask_to_bool_mask, feed_tokens, next_token_mask

PROMPT = [1000 + 37 * i for i in range(10)]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer"},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "ok"],
    "additionalProperties": False,
}
JSON = GuidedDecodingParams(json_schema=SCHEMA)
# Float32 attention over the whole static buffer (masked keys weigh 0) and batched matrix
# products sum in another order than batch-1 attention over the cached keys only; float64
# logits agree to ~1e-15 or exactly.
ATOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def _feed(
    runner: SlotRunner, slot: int, tokens: Sequence[int], num_logits: int = 1
) -> torch.Tensor:
    return runner.forward([ForwardInput(slot, tokens, num_logits)])


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=ATOL[expected.dtype])


def StaticModelRunner(  # noqa: N802 - reads as the class it stands for
    model: LoadedModel, *, max_num_seqs: int, max_cache_len: int | None = None
) -> BatchedModelRunner:
    """The batched runner with its static cache, as the graphs use it."""
    return BatchedModelRunner(
        model, max_num_seqs=max_num_seqs, max_cache_len=max_cache_len, static=True
    )


# --- the static batched runner against ModelRunner --------------------------------------------


def test_static_runner_matches_model_runner_through_prefill_and_decode(model: LoadedModel) -> None:
    static, dynamic = StaticModelRunner(model, max_num_seqs=2), ModelRunner(model, max_num_seqs=2)
    for runner in (static, dynamic):  # slot 1 prefilled in chunks, slot 0 at once
        _feed(runner, 1, PROMPT[:4], num_logits=2)
    _close(_feed(static, 0, PROMPT, 3), _feed(dynamic, 0, PROMPT, 3))
    _close(_feed(static, 1, PROMPT[4:], 2), _feed(dynamic, 1, PROMPT[4:], 2))
    token = 5
    for _ in range(6):
        inputs = [ForwardInput(0, [token]), ForwardInput(1, [token + 1])]
        expected = dynamic.forward(inputs)
        _close(static.forward(inputs), expected)
        token = int(expected[0].argmax())
    assert static.num_cached(0) == dynamic.num_cached(0) == len(PROMPT) + 6


def test_crop_then_continue_matches_model_runner(model: LoadedModel) -> None:
    static, dynamic = StaticModelRunner(model, max_num_seqs=1), ModelRunner(model, max_num_seqs=1)
    for runner in (static, dynamic):
        _feed(runner, 0, PROMPT[:6])
        _feed(runner, 0, [5, 6, 7], num_logits=3)  # drafts that get rejected
        runner.crop(0, 6)
        assert runner.num_cached(0) == 6
    _close(_feed(static, 0, PROMPT[6:], 4), _feed(dynamic, 0, PROMPT[6:], 4))
    static.crop(0, 0)
    dynamic.crop(0, 0)
    _close(_feed(static, 0, PROMPT[:3], 2), _feed(dynamic, 0, PROMPT[:3], 2))


def test_freed_slot_ignores_the_previous_sequence(model64: LoadedModel) -> None:
    """Stale keys past the recorded length stay in the buffer and must be masked out."""
    runner = StaticModelRunner(model64, max_num_seqs=1)
    _feed(runner, 0, PROMPT * 3)
    runner.free(0)
    assert runner.num_cached(0) == 0 and runner.export_cache(0).length == 0
    fresh = StaticModelRunner(model64, max_num_seqs=1)
    assert torch.equal(_feed(runner, 0, PROMPT[:4], 4), _feed(fresh, 0, PROMPT[:4], 4))


@pytest.mark.parametrize(
    ("source_cls", "target_cls"),
    [
        (StaticModelRunner, StaticModelRunner),
        (StaticModelRunner, ModelRunner),
        (ModelRunner, StaticModelRunner),
    ],
)
def test_export_import_round_trip_continues_like_the_source(
    model64: LoadedModel, source_cls: type[SlotRunner], target_cls: type[SlotRunner]
) -> None:
    source: Any = source_cls(model64, max_num_seqs=2)  # type: ignore[call-arg]
    _feed(source, 0, PROMPT[:7])
    state = source.export_cache(0)
    assert state.length == 7 and len(state.keys) == 4
    assert state.keys[0].shape[-2] == 7
    expected = _feed(source, 0, PROMPT[7:], 3)  # the source moves on; the state must not
    target: Any = target_cls(model64, max_num_seqs=3)
    _feed(target, 2, PROMPT[::-1])  # something to overwrite
    target.import_cache(2, state)
    assert target.num_cached(2) == 7
    _close(_feed(target, 2, PROMPT[7:], 3), expected)


def test_static_runner_refuses_bad_crop_import_and_sizes(model64: LoadedModel) -> None:
    runner = StaticModelRunner(model64, max_num_seqs=1)
    _feed(runner, 0, PROMPT[:3])
    for bad in (4, -1):
        with pytest.raises(ValueError, match=rf"cannot crop slot 0 to {bad} tokens: it holds 3"):
            runner.crop(0, bad)
    state = runner.export_cache(0)
    as_float32 = KVState(tuple(k.float() for k in state.keys), state.values, 3)
    with pytest.raises(ValueError, match="does not match length 3 and model dtype"):
        runner.import_cache(0, as_float32)
    with pytest.raises(ValueError, match=r"KV state has \(2, 2\) key/value layers; .* has 4"):
        runner.import_cache(0, KVState(state.keys[:2], state.values[:2], 3))
    with pytest.raises(ValueError, match="max_num_seqs must be at least 1, got 0"):
        StaticModelRunner(model64, max_num_seqs=0)
    with pytest.raises(ValueError, match=r"max_cache_len must be in \[1, max_model_len=4096\]"):
        StaticModelRunner(model64, max_num_seqs=1, max_cache_len=5000)


def test_smaller_max_cache_len_limits_the_sequence(model64: LoadedModel) -> None:
    runner = StaticModelRunner(model64, max_num_seqs=1, max_cache_len=12)
    assert runner.cache.capacity == 12
    _feed(runner, 0, PROMPT)
    with pytest.raises(
        ValueError, match=r"10 cached \+ 3 new tokens = 13 exceeds max_cache_len=12"
    ):
        _feed(runner, 0, [1, 2, 3])
    _feed(runner, 0, [1, 2])
    assert runner.num_cached(0) == 12


class _HostReads(TorchDispatchMode):
    """Records the ops that read a tensor's value on the host or size an output by it: each
    one is a device synchronization on CUDA, illegal while capturing a graph."""

    NAMES = ("_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if any(name.startswith(n) for n in self.NAMES):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_static_forward_reads_no_device_value_on_the_host(model64: LoadedModel) -> None:
    with _HostReads() as probe:
        torch.tensor([3]).item()
    assert probe.seen == ["_local_scalar_dense"]  # the probe sees what it looks for
    runner = StaticModelRunner(model64, max_num_seqs=2)
    _feed(runner, 0, PROMPT)
    static_inputs = torch.tensor([[7, 0], [len(PROMPT), 0], [0, runner.scratch_slot]])
    with _HostReads() as probe:
        runner.forward_packed(decode_batch(runner, static_inputs))
    assert probe.seen == []


# --- StepGraph and DecodeGraphs ----------------------------------------------------------------


def test_host_step_graph_replays_the_captured_function_on_new_static_inputs() -> None:
    source, result, calls = torch.tensor([1.0, 2.0]), torch.zeros(2), []

    def step() -> None:
        calls.append("step")
        torch.mul(source, 10, out=result)

    graph = HostStepGraph()
    graph.capture(step, warmup=lambda: calls.append("warmup"))
    assert calls == ["warmup"] and torch.equal(result, torch.zeros(2))  # capture runs nothing
    graph.replay()
    assert torch.equal(result, torch.tensor([10.0, 20.0]))
    source.copy_(torch.tensor([3.0, 4.0]))  # new inputs, written into the static tensor
    graph.replay()
    assert torch.equal(result, torch.tensor([30.0, 40.0]))
    with pytest.raises(ValueError, match="already captured"):
        graph.capture(step)
    with pytest.raises(ValueError, match="replay before capture"):
        HostStepGraph().replay()


def _decoder(model: LoadedModel, factory: GrammarMatcherFactory, slots: int) -> Any:
    config = GuidedDecodingConfig(
        backend="xgrammar", tokenizer=model.tokenizer, json_whitespace="compact"
    )
    return CapturableGuidedDecoder(
        GuidedDecoder(config=config, factory=factory, max_num_sequences=slots, device=model.device)
    )


def _prefilled(model: LoadedModel, slots: int) -> tuple[BatchedModelRunner, ModelRunner]:
    static, dynamic = (
        StaticModelRunner(model, max_num_seqs=slots),
        ModelRunner(model, max_num_seqs=slots),
    )
    for slot in range(slots):
        prompt = [p + slot for p in PROMPT]
        _feed(static, slot, prompt)
        _feed(dynamic, slot, prompt)
    return static, dynamic


def test_padded_size_is_the_next_power_of_two_within_max_num_seqs() -> None:
    assert [padded_size(b, 32) for b in (1, 2, 3, 4, 5, 8, 9, 17, 32)] == [
        1,
        2,
        4,
        4,
        8,
        8,
        16,
        32,
        32,
    ]
    assert [padded_size(b, 6) for b in (3, 5, 6)] == [4, 6, 6]


def test_decode_graphs_match_eager_steps_and_are_kept_per_padded_size_lru(
    model64: LoadedModel, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    static, dynamic = _prefilled(model64, 3)
    graphs = DecodeGraphs(
        static, _decoder(model64, make_factory("xgrammar", "compact"), 3), max_graphs=2
    )
    schedule = [(0, 1, 2)] * 3 + [(0, 2)] * 2 + [(0, 1, 2), (1,), (0, 2), (1, 2), (0, 1, 2)]
    expected_keys = [
        [(3, False)],
        [(3, False), (2, False)],
        [(2, False), (3, False)],  # reused: now the most recent
        [(3, False), (1, False)],  # size 2 evicted
        [(1, False), (2, False)],  # captured again; (1, 2) then replays it
        [(2, False), (3, False)],
    ]
    captures, keys_seen = [], []
    for step, slots in enumerate(schedule):
        inputs = [ForwardInput(s, [100 + 7 * step + s]) for s in slots]
        expected = dynamic.forward(inputs)
        logits, failures = graphs.run(inputs, guided=False)
        _close(logits, expected)
        assert failures == []
        captures.append(graphs.captures)
        if not keys_seen or graphs.cached_keys() != keys_seen[-1]:
            keys_seen.append(graphs.cached_keys())
    assert captures == [1, 1, 1, 2, 2, 2, 3, 4, 4, 5]
    assert keys_seen == expected_keys
    assert [static.num_cached(s) for s in range(3)] == [dynamic.num_cached(s) for s in range(3)]


def test_one_padded_graph_serves_every_slot_set_of_its_size(
    model64: LoadedModel, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    """Batches of 3 and 4 slots (in any order) replay the size-4 graph; the padding row writes
    only the scratch slot, so the slot left out keeps its cache."""
    static, dynamic = _prefilled(model64, 5)
    assert padded_size(3, 5) == padded_size(4, 5) == 4
    decoder = _decoder(model64, make_factory("xgrammar", "compact"), 5)
    graphs = DecodeGraphs(static, decoder)
    for step, slots in enumerate([(0, 1, 2), (3, 1, 0, 2), (2, 4, 3), (4, 0, 1, 3)]):
        inputs = [ForwardInput(s, [200 + 11 * step + s]) for s in slots]
        _close(graphs.run(inputs, guided=False)[0], dynamic.forward(inputs))
    assert graphs.captures == 1 and graphs.cached_keys() == [(4, False)]
    final = [ForwardInput(s, [9]) for s in range(5)]
    _close(static.forward(final), dynamic.forward(final))


def test_decode_graphs_refuse_other_steps_and_bad_inputs_without_running(
    model64: LoadedModel, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    static, _ = _prefilled(model64, 2)
    graphs = DecodeGraphs(static, _decoder(model64, make_factory("xgrammar", "compact"), 2))
    assert not is_decode_step([]) and not is_decode_step([ForwardInput(0, [1, 2])])
    assert not is_decode_step([ForwardInput(0, [1, 2], num_logits=2)])
    with pytest.raises(ValueError, match="one token and wants one logits row"):
        graphs.run([ForwardInput(0, [1, 2])], guided=False)
    with pytest.raises(ValueError, match="slot appears more than once"):
        graphs.run([ForwardInput(1, [1]), ForwardInput(1, [2])], guided=False)
    with pytest.raises(ValueError, match="max_graphs must be at least 1"):
        DecodeGraphs(static, graphs.decoder, max_graphs=0)
    assert graphs.captures == 0 and static.num_cached(0) == static.num_cached(1) == len(PROMPT)


def test_each_guided_replay_takes_exactly_its_queued_snapshot(
    model64: LoadedModel, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    _check_guided_replays(model64, make_factory("xgrammar", "compact"))


def _check_guided_replays(model: LoadedModel, factory: GrammarMatcherFactory) -> None:
    """Capture (with its warm-up) then replays of one slot set: each step's mask is that of a
    fresh matcher fed the tokens so far, so no snapshot was built twice or skipped."""
    tokenizer = model.tokenizer
    static, _ = _prefilled(model, 2)
    decoder = _decoder(model, factory, 2)
    graphs = DecodeGraphs(static, decoder)
    decoder.add_batch([GuidedRequest.context(JSON, request_id=0, seq_slot=1)])
    prefill_logits = torch.zeros(1, tokenizer.vocab_size, dtype=model.dtype, device=model.device)
    decoder.execute(prefill_logits)  # the eager prefill step creates the matcher
    decoder.drain_host_functions()
    tokens = tokenizer.encode('{"name":"ab","n":12,"ok":true}')
    for i, token in enumerate(tokens):
        step = GuidedRequest.generation(JSON, request_id=0, seq_slot=1, new_token=token)
        free = GuidedRequest.generation(None, request_id=1, seq_slot=0, new_token=token)
        decoder.add_batch([free, step])
        logits, failures = graphs.run(
            [ForwardInput(0, [token]), ForwardInput(1, [token])], guided=True
        )
        assert failures == [] and not decoder.queue
        matcher = factory.create(JSON)
        assert feed_tokens(matcher, tokens[: i + 1]) == i + 1
        if matcher.is_terminated():
            continue  # nothing is masked once the grammar has ended
        allowed = bitmask_to_bool_mask(
            next_token_mask(matcher, tokenizer.vocab_size)[None], tokenizer.vocab_size
        )[0]
        assert torch.equal(torch.isfinite(logits[1]).cpu(), allowed), i
        assert torch.isfinite(logits[0]).all()  # the unguided row is untouched
    assert graphs.captures == 1


@pytest.mark.gpu
def test_guided_replays_on_cuda_capture_once_and_mask_each_step(
    make_factory: Callable[..., GrammarMatcherFactory],
) -> None:
    model = load_model(TINY_RANDOM, device="cuda", dtype="float32")
    _check_guided_replays(model, make_factory("xgrammar", "compact"))


# --- the engine ----------------------------------------------------------------------------------


GUIDES = [
    JSON,
    GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,3}"),
    None,
    GuidedDecodingParams(json_schema={"type": "no-such-type"}),  # fails: reported, alone
    JSON,
]
PROMPTS = ["A record:", "Answer:", "Free text", "Broken guide", "Another record:"]


def _engine(backend: str, **options: Any) -> LLM:
    return LLM(
        "tiny-random",
        backend=backend,  # type: ignore[arg-type]
        max_num_seqs=4,  # five requests: one joins mid-flight, so slot sets change
        dtype=torch.float64,  # the two runners' attention must not flip an argmax
        json_whitespace="compact",
        **options,
    )


def _generate(
    llm: LLM, guides: Sequence[GuidedDecodingParams | None], max_tokens: int = 24
) -> list[Any]:
    params = [
        SamplingParams(max_tokens=max_tokens + 3 * i, guided_decoding=g)
        for i, g in enumerate(guides)
    ]
    results = llm.generate(PROMPTS[: len(guides)], params)
    return [(r.token_ids, r.finish_reason, r.error) for r in results]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_cuda_graph_engine_matches_the_eager_engine_token_for_token(backend: str) -> None:
    outputs = {}
    for cuda_graphs in (False, True):
        llm = _engine(backend, cuda_graphs=cuda_graphs, overlap=not cuda_graphs)
        outputs[cuda_graphs] = _generate(llm, GUIDES)
        if cuda_graphs:
            assert llm.graphs is not None and llm.graphs.captures >= 2
            assert any(guided for _, guided in llm.graphs.cached_keys())
        llm.close()
    assert outputs[True] == outputs[False]
    reasons = [reason for _, reason, _ in outputs[True]]
    assert reasons[3] == "grammar_error" and "grammar_error" not in reasons[:3] + reasons[4:]
    assert "stop" in reasons  # a guide ran to its end


def test_unguided_batches_replay_unguided_graphs() -> None:
    outputs = {}
    for cuda_graphs in (False, True):
        llm = _engine("xgrammar", cuda_graphs=cuda_graphs)
        outputs[cuda_graphs] = _generate(llm, [None, None, None], max_tokens=8)
        if cuda_graphs:
            assert llm.graphs is not None
            keys = llm.graphs.cached_keys()
            assert keys and not any(guided for _, guided in keys)
        llm.close()
    assert outputs[True] == outputs[False]


def test_a_failure_inside_a_replay_finishes_only_its_request() -> None:
    """A matcher that starts rejecting tokens mid-way fails its request in the replay's host
    functions; the others go on as they would have."""
    results = {}
    for sabotage in (False, True):
        llm = _engine("xgrammar", cuda_graphs=True)
        llm.factory.create(JSON)  # compiled before: the requests start decoding at once
        params = [SamplingParams(max_tokens=16, guided_decoding=g) for g in (JSON, JSON, None)]
        ids = [llm.add_request(p, s) for p, s in zip(PROMPTS, params, strict=False)]
        done: dict[int, Any] = {}
        steps = 0
        while len(done) < len(ids):
            steps += 1
            if sabotage and steps == 4:  # decoding by now: steps 2 and 3 were replays
                assert llm.graphs is not None and llm.graphs.captures == 1
                slot = llm._requests[ids[1]].slot
                assert slot is not None
                matcher = llm.decoder.grammar_matchers[slot]
                # Every accept says no: the checked one and the sampled token's (advance).
                reject = lambda token: False  # noqa: E731
                matcher.accept_token = matcher.advance = reject  # type: ignore[method-assign,union-attr]
                rejected = lambda token, bitmask, index: REJECTED  # noqa: E731
                matcher.advance_and_fill = rejected  # type: ignore[method-assign,union-attr]
            done.update((out.request_id, out) for out in llm.step())
        results[sabotage] = [done[i] for i in ids]
        llm.close()
    failed = results[True][1]
    assert failed.finish_reason == "grammar_error" and "is rejected by its grammar" in str(
        failed.error
    )
    for clean, sabotaged in zip(results[False], results[True], strict=True):
        if sabotaged is not failed:
            assert sabotaged.token_ids == clean.token_ids
            assert sabotaged.finish_reason == clean.finish_reason


def test_speculation_with_cuda_graphs_runs_eagerly_with_the_same_outputs() -> None:
    outputs = {}
    for cuda_graphs in (False, True):
        llm = _engine("xgrammar", cuda_graphs=cuda_graphs, speculative="ngram", num_draft_tokens=3)
        outputs[cuda_graphs] = _generate(llm, GUIDES[:3], max_tokens=12)
        assert llm.graphs is None
        assert isinstance(llm.runner, BatchedModelRunner)
        assert llm.runner.static is cuda_graphs
        llm.close()
    assert outputs[True] == outputs[False]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_cli_cuda_graphs_flag_reaches_the_engine(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from guidedec import cli_generate

    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli_generate, "LLM", lambda *args, **kwargs: seen.update(kwargs))
    prompts = ["hi"] if command == "generate" else []
    for argv, expected in (
        ([command, *prompts], False),
        ([command, "--cuda-graphs", *prompts], True),
    ):
        cli_generate.build_llm(build_parser().parse_args(argv))
        assert seen["cuda_graphs"] is expected
        assert seen["max_model_len"] is None
    cli_generate.build_llm(build_parser().parse_args([command, "--max-model-len", "64", *prompts]))
    assert seen["max_model_len"] == 64


# --- on a GPU -----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_graph_engine_matches_the_eager_engine_on_cuda() -> None:
    outputs = {}
    for cuda_graphs in (False, True):
        llm = _engine("xgrammar", cuda_graphs=cuda_graphs, device="cuda")
        outputs[cuda_graphs] = _generate(llm, GUIDES)
        if cuda_graphs:
            assert llm.graphs is not None and llm.graphs.captures >= 2
        llm.close()
    assert outputs[True] == outputs[False]


@pytest.mark.gpu
def test_a_steady_slot_set_captures_once_on_cuda(
    make_factory: Callable[..., GrammarMatcherFactory],
) -> None:
    model = load_model(TINY_RANDOM, device="cuda", dtype="float64")
    static, dynamic = _prefilled(model, 3)
    graphs = DecodeGraphs(static, _decoder(model, make_factory("xgrammar", "compact"), 3))
    token = 11
    for _ in range(8):
        inputs = [ForwardInput(s, [token + s]) for s in range(3)]
        expected = dynamic.forward(inputs)
        logits, _ = graphs.run(inputs, guided=False)
        _close(logits, expected)
        token = int(expected[0].argmax())
    assert graphs.captures == 1


def test_max_model_len_bounds_the_static_caches_and_the_sequences() -> None:
    llm = LLM("tiny-random", max_num_seqs=2, cuda_graphs=True, max_model_len=24)
    assert isinstance(llm.runner, BatchedModelRunner) and llm.runner.max_len == 24
    assert llm.runner.static and llm.runner.cache.capacity == 24
    [out] = llm.generate(["Hello"], SamplingParams(max_tokens=100))
    prompt_len = len(llm.tokenizer.encode("Hello"))
    assert out.finish_reason == "length" and prompt_len + len(out.token_ids) == 24
    with pytest.raises(ValueError, match="takes at most 24"):
        llm.generate(["word " * 30], SamplingParams(max_tokens=4))
    llm.close()
    with pytest.raises(ValueError, match=r"max_model_len must be in \[2, 4096\]"):
        LLM("tiny-random", max_model_len=5000)
