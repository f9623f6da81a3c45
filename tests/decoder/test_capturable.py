"""The capturable decoder's host functions on the CPU, in the order a CUDA graph runs them:
the protocol's order, warm-up replays, the queue of snapshots, tokens fetched from the pinned
buffer, failures handed out later, host-function errors kept for the caller, and the same
outputs as the plain decoder (speculative decoding included). GPU tests capture a real graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from guidedec import (
    GrammarMatcher,
    GrammarMatcherFactory,
    GuidedDecoder,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    GuidedRequest,
    TokenizerInfo,
)
from guidedec.decoder import hostfunc as hostfunc_module
from guidedec.decoder.capturable import CapturableGuidedDecoder
from guidedec.decoder.hostfunc import HostFunctionError, raise_pending_error
from guidedec.testing import (
    GreedyDrafter,
    GreedyRunner,
    RandomDrafter,
    ScriptedTarget,
    feed_tokens,
    next_token_mask,
    random_guided_generate,
)

BACKENDS = ["xgrammar", "llguidance"]
JSON = GuidedDecodingParams(
    json_schema={
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
)
REGEX = GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,3}")
GUIDES = [JSON, REGEX, None]


def make(
    tokenizer: TokenizerInfo,
    factory: GrammarMatcherFactory,
    backend: str,
    drafts: int = 0,
    device: str = "cpu",
) -> GuidedDecoder:
    config = GuidedDecodingConfig(
        backend=backend,  # type: ignore[arg-type]
        tokenizer=tokenizer,
        json_whitespace="compact",
    )
    return GuidedDecoder(
        config=config,
        factory=factory,
        max_num_sequences=len(GUIDES),
        max_num_draft_tokens=drafts,
        device=device,
    )


def make_capturable(*args: Any, **kwargs: Any) -> CapturableGuidedDecoder:
    """A capturable decoder wrapping ``make(*args, **kwargs)``."""
    return CapturableGuidedDecoder(make(*args, **kwargs))


@pytest.fixture(scope="module")
def compact(
    make_factory: Callable[..., GrammarMatcherFactory],
) -> Callable[[str], GrammarMatcherFactory]:
    return lambda backend: make_factory(backend, "compact")


def fed(factory: GrammarMatcherFactory, tokens: list[int]) -> GrammarMatcher:
    """A fresh JSON matcher fed ``tokens`` (all accepted)."""
    matcher = factory.create(JSON)
    assert feed_tokens(matcher, tokens) == len(tokens)
    return matcher


def context_batch() -> list[GuidedRequest]:
    return [GuidedRequest.context(g, request_id=i, seq_slot=i) for i, g in enumerate(GUIDES)]


def test_execute_runs_the_protocol_in_order(tokenizer, compact) -> None:
    decoder = make_capturable(tokenizer, compact("xgrammar"), "xgrammar")
    decoder.sync.trace = []
    decoder.add_batch(context_batch())
    decoder.execute(torch.zeros(len(GUIDES), tokenizer.vocab_size))
    assert decoder.sync.trace == [
        "main: record token_event",
        "side: wait token_event",
        "host: fetch_batch",
        "host: build_hostfunc",
        "host: build",
        "side: copy bitmask",
        "side: record bitmask_event",
        "main: wait bitmask_event",
        "main: apply bitmask",
    ]


def test_plain_decoder_orders_copy_and_apply_by_the_two_events(tokenizer, compact) -> None:
    decoder = make(tokenizer, compact("xgrammar"), "xgrammar")
    decoder.sync.trace = []
    decoder.add_batch(context_batch())
    decoder.execute(torch.zeros(len(GUIDES), tokenizer.vocab_size))
    assert decoder.sync.trace == [
        "host: build",
        "main: record token_event",
        "side: wait token_event",
        "side: copy bitmask",
        "side: record bitmask_event",
        "main: wait bitmask_event",
        "main: apply bitmask",
    ]


def test_an_eager_step_goes_to_the_wrapped_decoder_and_never_queues(tokenizer, compact) -> None:
    decoder = make_capturable(tokenizer, compact("xgrammar"), "xgrammar")
    batch = context_batch()
    decoder.decoder.add_batch(batch)
    assert decoder.decoder.requests is not None and decoder.decoder.requests.requests == batch
    assert not decoder.queue  # a later replay's fetch finds nothing of it
    assert decoder.decoder.build() == []  # built here, as a GuidedDecoder builds
    fresh = next_token_mask(compact("xgrammar").create(JSON), tokenizer.vocab_size)
    assert torch.equal(decoder.decoder.bitmask_host[0], fresh)
    decoder.add_batch(batch)  # the captured step's snapshot: queued
    assert len(decoder.queue) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_warm_up_replays_find_the_queue_empty_and_change_nothing(
    backend, tokenizer, compact
) -> None:
    factory = compact(backend)
    decoder = make_capturable(tokenizer, factory, backend)
    decoder.fetch_batch.run_now(decoder)  # a replay before any add_batch: nothing to take
    assert decoder.decoder.requests is None
    batch = context_batch()
    decoder.add_batch(batch)
    for _ in range(3):  # warm-up runs the captured step several times for one add_batch
        decoder.fetch_batch.run_now(decoder)
    assert decoder.decoder.requests is not None
    assert decoder.decoder.requests.requests == batch and not decoder.queue
    decoder.build_hostfunc.run_now(decoder)
    # One build, from the prompt state: row 0 is a fresh matcher's mask.
    fresh = next_token_mask(factory.create(JSON), tokenizer.vocab_size)
    assert torch.equal(decoder.decoder.bitmask_host[0], fresh)
    assert decoder.pop_failures() == [] and decoder.pop_failures() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_warm_up_replays_of_a_whole_step_build_each_snapshot_once(
    backend, tokenizer, compact
) -> None:
    """A warm-up replays fetch + build several times for one add_batch: the generation step's
    token must be fed to the matcher once, not once per replay."""
    factory = compact(backend)
    decoder = make_capturable(tokenizer, factory, backend)
    decoder.build_hostfunc.run_now(decoder)  # before any batch: nothing to build, no error
    decoder.drain_after_replay()
    assert decoder.pop_failures() == []
    token = tokenizer.encode('{"ok"')[0]
    decoder.add_batch([GuidedRequest.context(JSON, request_id=0, seq_slot=0)])
    decoder.fetch_batch.run_now(decoder)
    decoder.build_hostfunc.run_now(decoder)
    decoder.add_batch([GuidedRequest.generation(JSON, request_id=0, seq_slot=0, new_token=token)])
    for _ in range(3):
        decoder.fetch_batch.run_now(decoder)
        decoder.build_hostfunc.run_now(decoder)
    assert decoder.pop_failures() == []
    expected = next_token_mask(fed(factory, [token]), tokenizer.vocab_size)
    assert torch.equal(decoder.decoder.bitmask_host[0], expected)
    assert decoder.decoder.num_advanced_tokens[0] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_functions_take_queued_snapshots_in_order(backend, tokenizer, compact) -> None:
    """The caller queues step 1 and step 2 before the host functions of step 1 run."""
    factory = compact(backend)
    decoder = make_capturable(tokenizer, factory, backend)
    token = tokenizer.encode('{"ok"')[0]
    decoder.add_batch([GuidedRequest.context(JSON, request_id=0, seq_slot=0)])
    decoder.add_batch([GuidedRequest.generation(JSON, request_id=0, seq_slot=0, new_token=token)])
    assert len(decoder.queue) == 2
    for _ in range(2):
        decoder.fetch_batch.run_now(decoder)
        decoder.build_hostfunc.run_now(decoder)
    expected = next_token_mask(fed(factory, [token]), tokenizer.vocab_size)
    assert torch.equal(decoder.decoder.bitmask_host[0], expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fetch_batch_reads_new_and_draft_tokens_from_the_pinned_buffer(
    backend, tokenizer, compact
) -> None:
    factory = compact(backend)
    decoder = make_capturable(tokenizer, factory, backend, drafts=2)
    tokens = tokenizer.encode('{"ok":true')
    decoder.add_batch([GuidedRequest.context(JSON, request_id=0, seq_slot=1)])
    decoder.fetch_batch.run_now(decoder)
    decoder.build_hostfunc.run_now(decoder)
    # The caller does not know the sampled tokens yet: placeholders, and the device tensor.
    placeholder = GuidedRequest.generation(
        JSON, request_id=0, seq_slot=1, new_token=0, draft_tokens=[0, 0]
    )
    placeholder.prev_seq_slot = 0
    new_tokens = torch.zeros(3, len(GUIDES), 1, dtype=torch.int64)
    new_tokens[:, 1, 0] = torch.tensor(tokens[:3])
    decoder.add_batch([placeholder], new_tokens=new_tokens)
    decoder.fetch_batch.run_now(decoder)
    assert decoder.decoder.requests is not None
    (fetched,) = decoder.decoder.requests.requests  # a new snapshot: the caller's is left as is
    assert (fetched.new_token, fetched.draft_tokens) == (tokens[0], tuple(tokens[1:3]))
    assert (placeholder.new_token, placeholder.draft_tokens) == (0, (0, 0))
    assert decoder.requests is decoder.decoder.requests  # copy and apply see its rows
    decoder.build_hostfunc.run_now(decoder)
    for row in range(3):
        matcher = fed(factory, tokens[: row + 1])
        assert torch.equal(
            decoder.decoder.bitmask_host[row], next_token_mask(matcher, tokenizer.vocab_size)
        ), row
    with pytest.raises(ValueError, match="positions x slots"):
        decoder.add_batch([placeholder], new_tokens=torch.zeros(2, len(GUIDES)))


def test_failures_are_handed_out_once_after_the_host_functions_ran(tokenizer, compact) -> None:
    decoder = make_capturable(tokenizer, compact("xgrammar"), "xgrammar")
    bad = GuidedDecodingParams(json_schema='{"type": "no-such-type"}')
    decoder.add_batch([GuidedRequest.context(bad, request_id=7, seq_slot=0)])
    failures = decoder.execute(torch.zeros(1, tokenizer.vocab_size))
    assert [request_id for request_id, _ in failures] == [7]
    assert decoder.pop_failures() == []


def test_host_function_errors_are_kept_for_the_caller() -> None:
    """What the C trampoline does with a callable: run it once (or at every replay when it was
    captured) and keep its exception for ``raise_pending_error``."""
    calls: list[str] = []

    def boom() -> None:
        calls.append("boom")
        raise KeyError("lost")

    registry = hostfunc_module._callables
    registry[-1] = (lambda: calls.append("once"), False)
    registry[-2] = (boom, True)
    try:
        hostfunc_module._run(-1)
        hostfunc_module._run(-1)  # freed after its run
        hostfunc_module._run(-2)
        hostfunc_module._run(-2)  # captured: runs at every replay
        assert calls == ["once", "boom", "boom"]
        assert -1 not in registry and -2 in registry
        with pytest.raises(HostFunctionError, match="2 in all") as info:
            raise_pending_error()
        assert isinstance(info.value.__cause__, KeyError)
        raise_pending_error()  # cleared
    finally:
        registry.pop(-2, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_logits_generation_matches_the_plain_decoder(backend, tokenizer, compact) -> None:
    factory = compact(backend)
    plain = random_guided_generate(make(tokenizer, factory, backend), GUIDES, seed=3, max_tokens=24)
    wrapped = make_capturable(tokenizer, factory, backend)
    captured = random_guided_generate(
        wrapped.decoder, GUIDES, seed=3, max_tokens=24, stepper=wrapped
    )
    assert plain == captured
    assert any(o.finished for o in plain)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("drafter", ["greedy", "random"])
def test_speculative_decoding_matches_the_plain_decoder(
    backend, drafter, tokenizer, compact
) -> None:
    factory = compact(backend)
    target = ScriptedTarget(tokenizer.vocab_size, seed=11)
    results = []
    for wrap in (False, True):
        proposer = (
            GreedyDrafter(target, factory, GUIDES, tokenizer.eos_token_id)
            if drafter == "greedy"
            else RandomDrafter(tokenizer.vocab_size, seed=5)
        )
        decoder = make(tokenizer, factory, backend, drafts=3)
        runner = GreedyRunner(
            decoder,
            target,
            drafter=proposer,
            num_draft_tokens=3,
            max_tokens=30,
            oracle=factory,
            stepper=CapturableGuidedDecoder(decoder) if wrap else None,
        )
        results.append(runner.run(GUIDES))
        assert runner.stats.states_checked > 0
    assert results[0] == results[1]


@pytest.mark.gpu
def test_a_captured_step_masks_by_the_replayed_host_functions(tokenizer, compact) -> None:
    """Capture fetch + build + copy + apply once; each replay builds the next step's mask."""
    factory = compact("xgrammar")
    decoder = make_capturable(tokenizer, factory, "xgrammar", device="cuda")
    tokens = tokenizer.encode('{"ok":true,"n":12}')
    logits = torch.zeros(1, tokenizer.vocab_size, device="cuda")
    decoder.add_batch([GuidedRequest.context(JSON, request_id=0, seq_slot=0)])
    decoder.execute(logits)  # prefill step, eager: creates the matcher
    decoder.drain_host_functions()
    graph = torch.cuda.CUDAGraph()
    step = GuidedRequest.generation(JSON, request_id=0, seq_slot=0, new_token=tokens[0])
    step.prev_seq_slot = 0
    new_tokens = torch.zeros(1, len(GUIDES), dtype=torch.int32, device="cuda")
    new_tokens[0, 0] = tokens[0]
    decoder.add_batch([step], new_tokens=new_tokens)
    with torch.cuda.graph(graph):
        logits.zero_()
        decoder.execute(logits)
    for i, token in enumerate(tokens):
        if i > 0:
            new_tokens[0, 0] = token
            decoder.add_batch([step], new_tokens=new_tokens)
        graph.replay()
        decoder.drain_after_replay()
        torch.cuda.synchronize()
        reference = factory.create(JSON)
        assert feed_tokens(reference, tokens[: i + 1]) == i + 1
        expected = next_token_mask(reference, tokenizer.vocab_size)
        allowed = torch.isfinite(logits[0]).cpu()
        assert torch.equal(allowed, _bits(expected, tokenizer.vocab_size)), i
    assert decoder.pop_failures() == []


def _bits(row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    from guidedec.testing import bitmask_to_bool_mask

    return bitmask_to_bool_mask(row.unsqueeze(0), vocab_size)[0]
