"""guidedec inside a real vLLM (``make test-vllm``, in ``.venv-vllm``): the logits processor on
``tiny-random`` exported as a Hugging Face folder, against guidedec's own engine on the same
weights. Skipped where vLLM is not installed (the main ``.venv``)."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import jsonschema
import pytest
import torch

vllm = pytest.importorskip("vllm")

import guidedec  # noqa: E402
import guidedec.decoder.closing.settings  # noqa: E402
import guidedec.decoder.fill_timing  # noqa: E402
import guidedec.integrations.vllm  # noqa: E402
from guidedec import GuidedDecodingParams, SamplingParams  # noqa: E402
from guidedec.bitmask import apply_bitmask  # noqa: E402
from guidedec.decoder.closing import BudgetCloser  # noqa: E402
from guidedec.engine.model import export_model  # noqa: E402
from guidedec.grammar.auto import AutoMatcherFactory  # noqa: E402
from guidedec.integrations.vllm import GuidedLogitsProcessor  # noqa: E402
from guidedec.testing.faults import FAULT_TEXT, FaultPlan, inject  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
GUIDES: dict[str, tuple[dict[str, Any], Any]] = {
    "json_schema": (
        {"json_schema": PERSON},
        lambda t: jsonschema.validate(json.loads(t), PERSON) is None,
    ),
    "regex": ({"regex": "(yes|no)-[0-9]{2}"}, lambda t: re.fullmatch("(yes|no)-[0-9]{2}", t)),
    "choice": ({"choice": ["north", "south west"]}, lambda t: t in ("north", "south west")),
    "ebnf": (
        {"ebnf": 'root ::= "(" [a-c] [a-c]? ")"'},
        lambda t: re.fullmatch(r"\([a-c]{1,2}\)", t),
    ),
    "lark": ({"lark": 'start: "<" /[0-9]{1,3}/ ">"'}, lambda t: re.fullmatch("<[0-9]{1,3}>", t)),
}
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_model("tiny-random", tmp_path_factory.mktemp("tiny") / "tiny-random")


PROMPTS = ["Answer:", "Another:"]


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> dict[str, list[tuple[list[int], str]]]:
    """guidedec's own engine on the same weights, greedy, run before vLLM starts (vLLM's CPU
    worker keeps its cores busy while it lives)."""
    ours = guidedec.LLM(
        str(model_dir),
        max_num_seqs=4,
        json_whitespace="compact",  # as the engine fixture asks of the plugin
        auto_prefers="xgrammar",  # the plugin's default
        isolate_compiles=False,
    )
    outputs = {}
    for name, (guide, _) in sorted(GUIDES.items()):
        params = SamplingParams(
            max_tokens=MAX_TOKENS,
            guided_decoding=GuidedDecodingParams(**guide),
            close_within_budget=False,
        )
        outputs[name] = [(o.token_ids, o.finish_reason) for o in ours.generate(PROMPTS, params)]
    outputs["stops"] = [(list(ours.tokenizer.stop_token_ids), "")]
    ours.close()
    return outputs


def _vllm(model_dir: Path, processor: type[GuidedLogitsProcessor], **options: Any) -> Any:
    """vLLM on the exported model with ``processor``: float32, eager, 4 sequences, a 1 GiB KV
    cache, seed 0 (``options`` override or add to them)."""
    settings: dict[str, Any] = {
        "dtype": "float32",
        "max_model_len": 512,
        "max_num_seqs": 4,
        "enforce_eager": True,
        "kv_cache_memory_bytes": 1 << 30,  # the default takes most of the machine's memory
        "seed": 0,
        **options,
    }
    return vllm.LLM(str(model_dir), logits_processors=[processor], **settings)


@pytest.fixture(scope="module")
def engine(model_dir: Path, reference: dict[str, Any]) -> Iterator[Any]:
    # The batch fill's parallel path wherever a step has 4 rows of one backend; compact JSON, as
    # the reference (tiny-random's greedy picks would fill flexible whitespace runs).
    options = {"fill_mode": "parallel", "fill_threads": 2, "json_whitespace": "compact"}
    llm = _vllm(model_dir, GuidedLogitsProcessor, additional_config={"guidedec": options})
    yield llm
    del llm


def _params(guide: dict[str, Any] | None, max_tokens: int = MAX_TOKENS) -> Any:
    extra = None if guide is None else {"guidedec": guide}
    return vllm.SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=extra)


def _texts(engine: Any, prompts: list[str], params: Any) -> list[Any]:
    return [out.outputs[0] for out in engine.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("name", sorted(GUIDES))
def test_each_guide_type_ends_valid(engine: Any, name: str) -> None:
    guide, check = GUIDES[name]
    for out in _texts(engine, ["Answer:", "Another:", "Third:"], _params(guide)):
        assert out.finish_reason == "stop", out
        assert check(out.text), out.text


def test_a_bad_guide_is_refused_before_it_is_queued(engine: Any) -> None:
    """vLLM turns the processor's ``ValueError`` into its validation error (HTTP 400 served);
    the engine goes on."""
    refused = (ValueError, vllm.exceptions.VLLMValidationError)
    with pytest.raises(refused, match=r"invalid guide.*unterminated character class"):
        engine.generate(["x"], _params({"regex": "[unclosed"}), use_tqdm=False)
    with pytest.raises(refused, match="close_within_budget must be true or false"):
        engine.generate(["x"], _params({"regex": "a", "close_within_budget": "yes"}))
    with pytest.raises(refused, match="unexpected keyword"):
        engine.generate(["x"], _params({"regexp": "a"}))
    assert _texts(engine, ["x"], _params({"regex": "a+b"}))[0].finish_reason == "stop"


def test_requests_join_and_leave_mid_batch(engine: Any) -> None:
    """Ten requests through four slots, budgets apart, guided and not, in one call: each ends
    as it does alone."""
    names = sorted(GUIDES)
    requests = [
        (f"Request {i}:", None if i % 3 == 2 else GUIDES[names[i % len(names)]][0], 6 + 3 * i)
        for i in range(10)
    ]
    together = engine.generate(
        [p for p, _, _ in requests], [_params(g, m) for _, g, m in requests], use_tqdm=False
    )
    for (prompt, guide, budget), out in zip(requests, together, strict=True):
        alone = _texts(engine, [prompt], _params(guide, budget))[0]
        assert out.outputs[0].token_ids == alone.token_ids, prompt


def test_greedy_outputs_are_those_of_guidedecs_engine(
    engine: Any, reference: dict[str, list[tuple[list[int], str]]]
) -> None:
    """The same weights, float32, greedy, every guide type: the same tokens."""
    stops = set(reference["stops"][0][0])
    for name, (guide, _) in sorted(GUIDES.items()):
        theirs = _texts(engine, PROMPTS, _params(guide))
        # vLLM keeps the stop token in token_ids; guidedec leaves it out.
        kept = [([t for t in out.token_ids if t not in stops], out.finish_reason) for out in theirs]
        assert kept == reference[name], name


def test_vllms_own_guided_path_still_works_beside_it(engine: Any) -> None:
    """guidedec's xgrammar and llguidance are newer than vLLM's pins: vLLM's own structured
    outputs (its xgrammar backend) still give valid outputs in this environment."""
    params = vllm.SamplingParams(
        max_tokens=MAX_TOKENS,
        temperature=0,
        structured_outputs=vllm.sampling_params.StructuredOutputsParams(regex="(yes|no)-[0-9]{2}"),
    )
    for out in _texts(engine, PROMPTS, params):
        assert out.finish_reason == "stop" and re.fullmatch("(yes|no)-[0-9]{2}", out.text)


def test_served_by_vllms_openai_server(model_dir: Path) -> None:
    """``vllm serve`` with the processor: the guide in ``vllm_xargs`` (a JSON string), a bad one
    answered 400 by vLLM's server."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "vllm.entrypoints.openai.api_server"),
            *("--model", str(model_dir), "--port", str(port), "--max-model-len", "1024"),
            *("--kv-cache-memory-bytes", str(1 << 30)),
            *("--logits-processors", "guidedec.integrations.vllm:GuidedLogitsProcessor"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, "vLLM's server exited"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vLLM's server did not start"
            time.sleep(1)
        body = {"model": str(model_dir), "prompt": "Code:", "max_tokens": 10, "temperature": 0}
        guide = {"vllm_xargs": {"guidedec": json.dumps({"regex": "[0-9]{3}"})}}
        done = httpx.post(f"{url}/v1/completions", json={**body, **guide}, timeout=60).json()
        assert re.fullmatch("[0-9]{3}", done["choices"][0]["text"]), done
        bad = {"vllm_xargs": {"guidedec": json.dumps({"regex": "[0-9"})}}
        refused = httpx.post(f"{url}/v1/completions", json={**body, **bad}, timeout=60)
        assert refused.status_code == 400 and "invalid guide" in refused.json()["error"]["message"]
    finally:
        server.terminate()
        server.wait(timeout=60)


def _vllm_config(
    model_dir: Path, options: dict[str, Any], logprobs_mode: str = "raw_logprobs"
) -> Any:
    """What the processor reads of vLLM's config, without starting an engine."""
    model = SimpleNamespace(
        tokenizer=str(model_dir),
        trust_remote_code=False,
        get_vocab_size=lambda: 129280,
        logprobs_mode=logprobs_mode,
    )
    return SimpleNamespace(
        model_config=model,
        additional_config={"guidedec": options},
        scheduler_config=SimpleNamespace(max_num_seqs=2),
    )


def test_an_unknown_engine_option_is_an_error(model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"does not know: \['fil_mode'\]"):
        GuidedLogitsProcessor(_vllm_config(model_dir, {"fil_mode": "auto"}), "cpu", False)
    with pytest.raises(ValueError, match="out_of_place must be true or false"):
        GuidedLogitsProcessor(_vllm_config(model_dir, {"out_of_place": "no"}), "cpu", False)
    processor = GuidedLogitsProcessor(
        _vllm_config(model_dir, {"fill_mode": "sequential", "backend": "llguidance"}), "cpu", False
    )
    assert processor.factory.config.backend == "llguidance"
    assert processor.decoder._filler.mode == "sequential"
    with pytest.raises(ValueError, match="auto_prefers must be one of"):
        GuidedLogitsProcessor(_vllm_config(model_dir, {"auto_prefers": "auto"}), "cpu", False)
    default = GuidedLogitsProcessor(_vllm_config(model_dir, {}), "cpu", False)
    assert default.factory.config.auto_prefers == "xgrammar"
    assert default.factory.config.json_whitespace == "flexible"  # measured best on a real model
    engines = GuidedLogitsProcessor(
        _vllm_config(model_dir, {"auto_prefers": "llguidance"}), "cpu", False
    )
    params = GuidedDecodingParams(json_schema={"type": "object", "required": ["a"]})
    assert engines.factory.create(params).backend == "llguidance"


@pytest.mark.parametrize("close", [None, True, False])
def test_objects_are_closed_unless_the_option_says_not(model_dir: Path, close: bool | None) -> None:
    """``disable_additional_properties`` (on by default, as in guidedec's engine) closes an
    object that names its properties; off, the request's guide is its own."""
    options = {} if close is None else {"disable_additional_properties": close}
    processor = GuidedLogitsProcessor(_vllm_config(model_dir, options), "cpu", False)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    params = SimpleNamespace(extra_args={"guidedec": {"json_schema": schema}})
    processor.update_state(
        vllm.v1.sample.logits_processor.BatchUpdate(1, [], [(0, params, [1], [])], [])
    )
    guide = json.loads(str(processor.rows[0].guide.guide))
    assert guide.get("additionalProperties") is (False if close is not False else None)
    with pytest.raises(ValueError, match="disable_additional_properties must be true or false"):
        GuidedLogitsProcessor(
            _vllm_config(model_dir, {"disable_additional_properties": "yes"}), "cpu", False
        )


def test_the_backends_are_built_when_the_processor_is(model_dir: Path) -> None:
    """Both backends of ``auto`` are built at engine start (their views of the tokenizer), not
    by the first guide that needs each one, inside a step."""
    processor = GuidedLogitsProcessor(_vllm_config(model_dir, {}), "cpu", False)
    factory = processor.factory
    assert isinstance(factory, AutoMatcherFactory)
    assert sorted(factory._factories) == ["llguidance", "xgrammar"]


def test_masked_logits_come_back_out_of_place_bit_for_bit(model_dir: Path) -> None:
    """Step by step, as vLLM drives it: what ``apply`` returns is exactly the logits masked in
    place by the step's bitmask; the structural rows went through the buffer (the logits vLLM
    passed are left as they were), and the sampler's in-place temperature on the returned
    tensor changes nothing later."""
    processor = GuidedLogitsProcessor(_vllm_config(model_dir, {}), "cpu", False)
    assert processor.mask_buffer is not None
    outputs: list[list[int]] = [[], []]
    guides = [{"json_schema": PERSON}, {"regex": "(yes|no)-[0-9]{2}"}]
    added = [
        (i, SimpleNamespace(extra_args={"guidedec": guide}), [1], outputs[i])
        for i, guide in enumerate(guides)
    ]
    update: Any = vllm.v1.sample.logits_processor.BatchUpdate(2, [], added, [])
    generator = torch.Generator().manual_seed(0)
    for _ in range(8):
        processor.update_state(update)
        update = None
        logits = torch.randn(2, 129280, generator=generator)
        before = logits.clone()
        masked = processor.apply(logits)
        expected = before.clone()
        apply_bitmask(expected, processor.bitmask[:2])
        assert torch.equal(masked.view(torch.int32), expected.view(torch.int32))
        if masked.data_ptr() != logits.data_ptr():
            assert torch.equal(logits, before)
        for row, token in enumerate(masked.argmax(dim=-1).tolist()):
            outputs[row].append(token)
        masked.div_(0.5)
    assert processor.mask_buffer.buffered_calls >= 4
    assert outputs[1][:3] and all(len(out) == 8 for out in outputs)


def test_the_buffer_is_not_used_where_vllm_could_see_it_or_write_into_it(model_dir: Path) -> None:
    off = GuidedLogitsProcessor(_vllm_config(model_dir, {"out_of_place": False}), "cpu", False)
    processed = GuidedLogitsProcessor(
        _vllm_config(model_dir, {}, logprobs_mode="processed_logprobs"), "cpu", False
    )
    assert off.mask_buffer is None and processed.mask_buffer is None
    thinking = GuidedLogitsProcessor(_vllm_config(model_dir, {}), "cpu", False)
    params = SimpleNamespace(extra_args={"guidedec": {"regex": "a"}}, thinking_token_budget=4)
    update = vllm.v1.sample.logits_processor.BatchUpdate(1, [], [(0, params, [1], [])], [])
    thinking.update_state(update)
    assert thinking.mask_buffer is None
    logits = torch.randn(1, 129280)
    assert thinking.apply(logits) is logits


OPEN_ENDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "tags"],
}


def test_budget_closing_ends_outputs_complete_within_max_tokens(engine: Any) -> None:
    """Sampled at temperature 1, tiny-random writes strings until its budget runs out; with
    ``close_within_budget`` every output ends complete and valid within ``max_tokens``."""

    def run(closing: bool, budget: int) -> list[Any]:
        guide = {"json_schema": OPEN_ENDED, "close_within_budget": closing}
        params = [
            vllm.SamplingParams(
                max_tokens=budget, temperature=1.0, seed=i, extra_args={"guidedec": guide}
            )
            for i in range(4)
        ]
        prompts = [f"Item {i}:" for i in range(4)]
        return [out.outputs[0] for out in engine.generate(prompts, params, use_tqdm=False)]

    cut = [out.finish_reason for budget in (16, 32) for out in run(False, budget)]
    assert "length" in cut  # without closing, outputs run out of budget
    for budget in (16, 32):
        for out in run(True, budget):
            assert out.finish_reason == "stop" and len(out.token_ids) <= budget, out
            jsonschema.validate(json.loads(out.text), OPEN_ENDED)


def test_grammar_state_and_closing_follow_requests_through_moves(model_dir: Path) -> None:
    """vLLM's batch indices are the decoder's slots: a swap trades two requests' matchers and
    closing witnesses, a one-way move drops what it overwrites, a removal frees the slot."""
    processor = GuidedLogitsProcessor(
        _vllm_config(model_dir, {"backend": "xgrammar"}), "cpu", False
    )
    decoder = processor.decoder
    closing = SimpleNamespace(
        extra_args={"guidedec": {"regex": "a+", "close_within_budget": True}}, max_tokens=8
    )
    plain = SimpleNamespace(extra_args={"guidedec": {"regex": "a+"}}, max_tokens=8)
    batch = vllm.v1.sample.logits_processor.BatchUpdate
    swap = vllm.v1.sample.logits_processor.MoveDirectionality.SWAP
    one_way = vllm.v1.sample.logits_processor.MoveDirectionality.UNIDIRECTIONAL
    logits = torch.zeros(2, 129280)
    processor.update_state(batch(2, [], [(0, closing, [1, 2], []), (1, plain, [1], [])], []))
    processor.apply(logits)
    first, second = decoder.grammar_matchers[:2]
    assert first is not None and second is not None and first is not second
    assert processor.rows[0].budget == 8 and processor.rows[1].budget is None
    witness = decoder.closer._slots[0]
    processor.update_state(batch(2, [], [], [(0, 1, swap)]))
    processor.apply(logits)
    assert decoder.grammar_matchers[:2] == [second, first]  # each with its request
    assert decoder.closer._slots[1] is witness and processor.rows[1].budget == 8
    processor.update_state(batch(2, [], [(0, closing, [1], [])], [(0, 1, one_way)]))
    # the one-way move replaced the first closing request: its state is gone
    assert 0 not in processor.rows and decoder.grammar_matchers[0] is None
    processor.apply(logits)
    assert decoder.grammar_matchers[1] not in (None, first, second)
    assert decoder.closer._slots[1] is not witness
    processor.update_state(batch(0, [1], [], []))
    assert decoder.grammar_matchers[:2] == [None, None] and not processor.rows


class _RecordingProcessor(GuidedLogitsProcessor):
    """Records how many output tokens each request brings when vLLM adds it to the batch."""

    added: ClassVar[list[int]] = []

    def update_state(self, batch_update: Any) -> None:
        if batch_update is not None:
            self.added.extend(len(output) for _, _, _, output in batch_update.added)
        super().update_state(batch_update)


def test_preempted_requests_come_back_with_their_tokens(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KV cache of about 300 tokens for eight requests of 200 characters: vLLM preempts some
    and adds them again later with the tokens they had. Each gets a new matcher fed those tokens
    (its mask goes on from where the output is): every output is exactly 200 characters of the
    guide's class, which a matcher fed too few or too many tokens would break."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the processor in this process
    _RecordingProcessor.added.clear()
    llm = _vllm(
        model_dir,
        _RecordingProcessor,
        max_model_len=256,
        max_num_seqs=8,
        kv_cache_memory_bytes=700_000,
        block_size=32,
    )
    try:
        guide = {"regex": "[a-z ]{200}"}
        params = vllm.SamplingParams(max_tokens=120, temperature=0, extra_args={"guidedec": guide})
        outputs = _texts(llm, [f"Request {i}:" for i in range(8)], params)
    finally:
        del llm
    assert any(count > 0 for count in _RecordingProcessor.added), "vLLM preempted nothing"
    for out in outputs:
        assert out.finish_reason == "stop" and re.fullmatch("[a-z ]{200}", out.text), out


def test_a_prompt_prefilled_in_chunks_keeps_its_row_guided(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM asks for the logits of a request whose prompt is still being prefilled in chunks
    (64 tokens a step here): its row is filled again where its matcher is at each such step
    (``GuidedRequest.unchanged``), so every output follows its guide from its first token."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the processor in this process
    refills: list[int] = []
    snapshot = guidedec.integrations.vllm._Row.snapshot

    def recording(row: Any, index: int) -> Any:
        request = snapshot(row, index)
        refills.extend([index] if request.refill else [])
        return request

    monkeypatch.setattr(guidedec.integrations.vllm._Row, "snapshot", recording)
    llm = _vllm(
        model_dir, GuidedLogitsProcessor, max_num_batched_tokens=64, enable_chunked_prefill=True
    )
    try:
        guide = {"regex": "[a-z]{10}"}
        params = vllm.SamplingParams(max_tokens=20, temperature=0, extra_args={"guidedec": guide})
        outputs = _texts(llm, ["word " * 150, "Short:"], params)
    finally:
        del llm
    assert refills, "no row was filled again: vLLM prefilled no prompt in chunks"
    for out in outputs:
        assert out.finish_reason == "stop" and re.fullmatch("[a-z]{10}", out.text), out


UNLEXABLE = {"type": "string", "pattern": "^a{1000000}$"}
"""A pattern llguidance compiles, then refuses to lex at the first token."""
FAULTY = {
    "type": "object",
    "properties": {"tag": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
    "required": ["tag", "n"],
}


class _FaultyProcessor(GuidedLogitsProcessor):
    """The processor with the matchers of ``FAULTY`` failing where ``plan`` says."""

    plan: ClassVar[FaultPlan] = FaultPlan()
    made: ClassVar[list[GuidedLogitsProcessor]] = []

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        inject(self, self.plan, [GuidedDecodingParams(json_schema=FAULTY)])
        self.made.append(self)


@pytest.fixture(scope="module")
def faulty_engine(model_dir: Path) -> Iterator[Any]:
    """vLLM in this process (the test arms the processor's plan), llguidance as the backend,
    each guide as written."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # Every run makes the same calls: the closing search's time limit is lifted.
        patch.setattr(guidedec.decoder.closing.settings, "SLOW_SEARCH_S", math.inf)
        # No fill is timed (a slow step would time the next ones' fills, through another call).
        patch.setattr(guidedec.decoder.fill_timing, "FILL_TIMING_S", math.inf)
        # The faults find their request by its guide as written: objects stay open.
        options = {
            "backend": "llguidance",
            "disable_additional_properties": False,
            "mask_time_limit_ms": None,
        }
        llm = _vllm(model_dir, _FaultyProcessor, additional_config={"guidedec": options})
        yield llm
        del llm


HEALTHY_GUIDES = [{"json_schema": PERSON}, {"regex": "(yes|no)-[0-9]{2}"}]
FAULTY_PROMPTS = ["Answer:", "A tag:", "Another:"]


def _faulty_batch(engine: Any, guide: dict[str, Any]) -> list[Any]:
    for processor in _FaultyProcessor.made:  # closing keeps a guide's witnesses for the next
        decoder = processor.decoder  # outputs: each run starts without them
        decoder.closer = BudgetCloser(decoder.config.tokenizer, decoder.max_num_sequences)
    guides = [HEALTHY_GUIDES[0], guide, HEALTHY_GUIDES[1]]
    return _texts(engine, FAULTY_PROMPTS, [_params(g, 24) for g in guides])


def _healthy_alone(engine: Any) -> list[list[int]]:
    _FaultyProcessor.plan.arm()
    prompts = [FAULTY_PROMPTS[0], FAULTY_PROMPTS[2]]
    return [
        _texts(engine, [p], _params(g, 24))[0].token_ids
        for p, g in zip(prompts, HEALTHY_GUIDES, strict=True)
    ]


def test_a_pattern_llguidance_cannot_lex_ends_its_request_alone(
    faulty_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: before, llguidance's lexer error escaped the processor's feed and
    vLLM's engine died (``EngineDeadError``) with every request in flight."""
    alone = _healthy_alone(faulty_engine)
    with caplog.at_level(logging.ERROR, logger="guidedec.integrations.vllm"):
        first, hostile, last = _faulty_batch(faulty_engine, {"json_schema": UNLEXABLE})
    assert [first.token_ids, last.token_ids] == alone
    assert hostile.finish_reason == "stop" and len(hostile.token_ids) <= 2, hostile
    assert "too many expressions" in caplog.text
    assert _healthy_alone(faulty_engine) == alone  # vLLM serves on


def test_a_backend_failure_at_each_plugin_call_site_ends_its_request_alone(
    faulty_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call site the processor reaches a matcher from (its feed, its fills, closing's
    search), recorded by a first run, then failed there: the request ends at its next token
    (a stop token), the failure is logged, the others are unchanged and vLLM serves on."""
    plan = _FaultyProcessor.plan
    alone = _healthy_alone(faulty_engine)
    guide = {"json_schema": FAULTY, "close_within_budget": True}
    plan.arm()
    baseline = _faulty_batch(faulty_engine, guide)
    assert [baseline[0].token_ids, baseline[2].token_ids] == alone
    sites = sorted(plan.calls)
    reached = {site for _, site in sites}
    decoder = {  # the plugin's matchers are its decoder's: created, advanced, filled, closed
        "guidedec.decoder.advance:start",
        "guidedec.decoder.advance:running",
        "guidedec.decoder.rows:fill_request",
        "guidedec.decoder.base:_close",
    }
    assert decoder | {"guidedec.decoder.closing.search:witness"} <= reached, sorted(reached)
    stops = set(faulty_engine.get_tokenizer().all_special_ids)
    for method, site in sites:
        plan.arm(method, site)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="guidedec.integrations.vllm"):
            first, faulty, last = _faulty_batch(faulty_engine, guide)
        assert plan.fired is not None, (method, site)
        assert [first.token_ids, last.token_ids] == alone, (method, site)
        tokens = faulty.token_ids
        assert tokens[-1] in stops and tokens[:-1] == baseline[1].token_ids[: len(tokens) - 1]
        assert FAULT_TEXT in caplog.text, (method, site)
    plan.arm()
    assert _faulty_batch(faulty_engine, guide)[1].token_ids == baseline[1].token_ids


def test_a_dead_end_row_ends_its_request_instead_of_a_row_of_minus_inf(
    faulty_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A filled row that allows no token would become a whole row of -inf: the processor ends
    the request instead (its stop tokens only), as guidedec's engine fails it."""
    plan = _FaultyProcessor.plan
    alone = _healthy_alone(faulty_engine)
    plan.arm()
    baseline = _faulty_batch(faulty_engine, {"json_schema": FAULTY})[1].token_ids
    plan.arm("advance_and_fill", nth=2, dead_end=True)  # the third row: the first is a fill
    with caplog.at_level(logging.ERROR, logger="guidedec.integrations.vllm"):
        first, dead, last = _faulty_batch(faulty_engine, {"json_schema": FAULTY})
    assert plan.fired is not None
    assert [first.token_ids, last.token_ids] == alone
    assert dead.finish_reason == "stop" and dead.token_ids[:2] == baseline[:2]
    assert len(dead.token_ids) == 3 and "dead end" in caplog.text
    plan.arm()


def test_min_tokens_against_a_finished_guide_ends_it_instead_of_a_row_of_minus_inf(
    faulty_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's ``min_tokens`` masks the stop tokens before the processor runs: where the guide
    allows nothing else (a complete output, or a request that failed) the row would be all
    -inf and vLLM would sample token 0 from it. The request ends at its stop token instead."""
    stops = set(faulty_engine.get_tokenizer().all_special_ids)
    guides = [{"regex": "(yes|no)-[0-9]{2}"}, {"json_schema": UNLEXABLE}]
    params = [
        vllm.SamplingParams(max_tokens=24, min_tokens=12, temperature=0, extra_args={"guidedec": g})
        for g in guides
    ]
    with caplog.at_level(logging.WARNING, logger="guidedec.integrations.vllm"):
        complete, failed = _texts(faulty_engine, ["Answer:", "Oops:"], params)
    assert complete.finish_reason == "stop" and re.fullmatch("(yes|no)-[0-9]{2}", complete.text)
    assert complete.token_ids[-1] in stops and 0 not in complete.token_ids
    assert failed.finish_reason == "stop" and len(failed.token_ids) <= 2
    assert "no token left" in caplog.text
