"""The reference engine end to end on tiny-random (CPU): every guide type, failures per request,
speculative decoding, chunked prefill, continuous batching, disaggregated prefill, abort, seeds.

Equivalence tests compare outputs token for token. One forward runs every sequence of a step,
so what else is in the batch, and feeding tokens in chunks of another size, changes the order
of floating-point sums (a matmul over 5 rows rounds differently from 5 matmuls over 1): the
tests that change the batch or the chunking (joins, speculation, chunked prefill) run the model
in float64, where such differences cannot flip an argmax.
"""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.grammar.matcher import GrammarMatcher, GrammarMatcherFactory, WrappedFactory
from guidedec.testing import feed_tokens

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
REGEX = r"(yes|no|maybe)-[0-9]{1,3}"
EBNF = 'root ::= "(" item ("," item)? ")"\nitem ::= "x" | "y" | [0-9]'
LARK = 'start: "[" ITEM ("," ITEM)? "]"\nITEM: /[a-c]/'
TAG = {
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": "<answer>",
        "content": {"type": "json_schema", "json_schema": {"enum": ["a", "b"]}},
        "end": "</answer>",
    },
}
GUIDES = {
    "json_schema": GuidedDecodingParams(json_schema=SCHEMA),
    "json_object": GuidedDecodingParams(json_object=True),
    "regex": GuidedDecodingParams(regex=REGEX),
    "ebnf": GuidedDecodingParams(ebnf=EBNF),
    "lark": GuidedDecodingParams(lark=LARK),
    "choice": GuidedDecodingParams(choice=["red", "green", "blue"]),
    "structural_tag": GuidedDecodingParams(structural_tag=TAG),
}
PROMPTS = ["Describe a person:", "Once upon a time", "The answer is", "List:"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-random", max_num_seqs=4, json_whitespace="compact")


def follows(llm: LLM, params: GuidedDecodingParams, token_ids: list[int], complete: bool) -> bool:
    """The tokens are accepted one by one by a fresh matcher, then a stop token if complete."""
    matcher = llm.factory.create(params)
    if feed_tokens(matcher, token_ids) != len(token_ids):
        return False
    return not complete or matcher.accept_token(llm.tokenizer.eos_token_id)


def test_every_guide_type_yields_valid_outputs(llm: LLM) -> None:
    names = list(GUIDES)
    params = [SamplingParams(max_tokens=64, guided_decoding=GUIDES[n]) for n in names]
    outputs = llm.generate([PROMPTS[i % 4] for i in range(len(names))], params)
    for name, out in zip(names, outputs, strict=True):
        assert out.error is None, (name, out.error)
        assert follows(llm, GUIDES[name], out.token_ids, out.finish_reason == "stop"), name
        if out.finish_reason == "stop":
            check_text(name, out.text)
    stopped = [n for n, o in zip(names, outputs, strict=True) if o.finish_reason == "stop"]
    assert {"json_schema", "regex", "ebnf", "lark", "choice", "structural_tag"} <= set(stopped)


def check_text(name: str, text: str) -> None:
    if name == "json_schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif name == "json_object":
        assert isinstance(json.loads(text), dict)
    elif name == "regex":
        assert re.fullmatch(REGEX, text, re.ASCII)
    elif name == "choice":
        assert text in {"red", "green", "blue"}
    elif name == "structural_tag":
        assert text in {'<answer>"a"</answer>', '<answer>"b"</answer>'}


def test_an_invalid_guide_fails_only_its_request(llm: LLM) -> None:
    params = [
        SamplingParams(max_tokens=16, guided_decoding=GUIDES["regex"]),
        SamplingParams(max_tokens=16, guided_decoding=GuidedDecodingParams(regex="(unclosed")),
        SamplingParams(max_tokens=16, guided_decoding=GuidedDecodingParams(ebnf="root ::= x")),
        SamplingParams(max_tokens=16),
    ]
    outputs = llm.generate(PROMPTS, params)
    assert [o.finish_reason for o in outputs[1:3]] == ["grammar_error", "grammar_error"]
    assert "regex" in (outputs[1].error or "") and outputs[1].token_ids == []
    assert outputs[0].finish_reason == "stop" and outputs[0].error is None
    assert outputs[3].finish_reason == "length" and len(outputs[3].token_ids) == 16


def test_a_slow_grammar_times_out_without_holding_up_the_batch(llm: LLM) -> None:
    slow = SlowFactory(llm.grammars.factory, delay_s=1.5)
    llm.grammars.factory, timeout = slow, llm.grammars.timeout_s
    llm.grammars.timeout_s = 0.3
    try:
        params = [
            SamplingParams(max_tokens=4, guided_decoding=GuidedDecodingParams(regex="z+")),
            SamplingParams(max_tokens=4),
        ]
        start = time.perf_counter()
        outputs = llm.generate(PROMPTS[:2], params)
    finally:
        llm.grammars.factory, llm.grammars.timeout_s = slow.inner, timeout
    assert outputs[0].finish_reason == "grammar_error" and "timed out" in (outputs[0].error or "")
    assert outputs[1].finish_reason == "length"
    assert time.perf_counter() - start < 1.5


class SlowFactory(WrappedFactory):
    """Compiles through ``inner`` after a delay, counting the compiles."""

    def __init__(self, inner: GrammarMatcherFactory, delay_s: float) -> None:
        super().__init__(inner)
        self.delay_s = delay_s
        self.calls = 0

    def compile(self, params: GuidedDecodingParams) -> object:
        self.calls += 1
        time.sleep(self.delay_s)
        return self.inner.compile(params)


def test_same_seed_same_output_and_sampling_respects_the_grammar() -> None:
    # float64: when a guided request joins the batch (its compile is polled each step) does
    # not move a float32 rounding that top_p could turn into another token.
    llm = LLM("tiny-random", max_num_seqs=4, json_whitespace="compact", dtype="float64")

    def run(seed: int) -> list[list[int]]:
        params = [
            SamplingParams(
                max_tokens=24,
                temperature=1.0,
                top_p=0.9,
                seed=seed + i,
                guided_decoding=GUIDES["json_schema"] if i % 2 else None,
            )
            for i in range(4)
        ]
        return [o.token_ids for o in llm.generate(PROMPTS, params)]

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    assert follows(llm, GUIDES["json_schema"], first[1], complete=False)


def test_requests_joining_mid_flight_equal_the_same_requests_alone(f64: dict[str, LLM]) -> None:
    llm = f64["plain"]
    params = [
        SamplingParams(max_tokens=20, guided_decoding=g)
        for g in (GUIDES["json_schema"], None, GUIDES["ebnf"])
    ]
    alone = [llm.generate([p], [s])[0].token_ids for p, s in zip(PROMPTS, params, strict=False)]
    first = llm.add_request(PROMPTS[0], params[0])
    outputs = {}
    for _ in range(3):
        outputs.update({o.request_id: o for o in llm.step()})
    later = [llm.add_request(PROMPTS[1], params[1]), llm.add_request(PROMPTS[2], params[2])]
    while llm.has_unfinished_requests():
        outputs.update({o.request_id: o for o in llm.step()})
    assert [outputs[i].token_ids for i in [first, *later]] == alone


def test_abort_frees_the_slot_and_the_matcher(llm: LLM) -> None:
    # At least 300 items of two characters or more: no request can end while the test waits.
    long_array = {"type": "array", "items": {"type": "integer"}, "minItems": 300}
    params = SamplingParams(
        max_tokens=200, guided_decoding=GuidedDecodingParams(json_schema=long_array)
    )
    ids = [llm.add_request(PROMPTS[i % 4], params) for i in range(5)]
    for _ in range(20):  # requests start as their grammars compile (one step or more each)
        if len(llm.scheduler.running) == 4:
            break
        assert llm.step() == []
    assert len(llm.scheduler.running) == 4 and len(llm.scheduler.waiting) == 1
    victim = llm.scheduler.running[0]
    slot = victim.slot
    assert slot is not None and llm.decoder.grammar_matchers[slot] is not None
    assert llm.abort(victim.request_id) is True
    assert llm.abort(victim.request_id) is False
    assert llm.decoder.grammar_matchers[slot] is None and llm.runner.num_cached(slot) == 0
    outputs = {o.request_id: o for o in llm.step()}
    assert outputs[victim.request_id].finish_reason == "abort"
    assert ids[4] in {r.request_id for r in llm.scheduler.running}  # took the freed slot
    aborted = {request_id for request_id in ids if llm.abort(request_id)}
    while llm.has_unfinished_requests() or len(outputs) < len(ids):
        outputs.update({o.request_id: o for o in llm.step()})
    assert set(outputs) == set(ids)
    assert all(outputs[i].finish_reason == "abort" for i in aborted)
    assert len(llm.scheduler.free_slots) == 4


@pytest.fixture(scope="module")
def f64() -> dict[str, LLM]:
    common = {"max_num_seqs": 3, "dtype": "float64", "json_whitespace": "compact"}
    return {
        "plain": LLM("tiny-random", **common),
        "ngram": LLM("tiny-random", speculative="ngram", num_draft_tokens=3, **common),
        "draft": LLM(
            "tiny-random", speculative="draft:tiny-random-draft", num_draft_tokens=3, **common
        ),
    }


# Closing off: with it, a guided request drafts nothing in the last window of its budget (here
# all of its 40 tokens), where each sampled token is checked (tests/engine/test_equivalence.py
# has closing on).
F64_PARAMS = [
    SamplingParams(max_tokens=40, guided_decoding=GUIDES["json_schema"], close_within_budget=False),
    SamplingParams(max_tokens=40),
    SamplingParams(max_tokens=40, guided_decoding=GUIDES["ebnf"], close_within_budget=False),
]
F64_PROMPTS = ["Repeat: a b c a b c a b", "Describe a person:", "List:"]


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculative_greedy_equals_plain_greedy(f64: dict[str, LLM], mode: str) -> None:
    plain = [o.token_ids for o in f64["plain"].generate(F64_PROMPTS, F64_PARAMS)]
    spec = f64[mode]
    outputs = spec.generate(F64_PROMPTS, F64_PARAMS)
    assert [o.token_ids for o in outputs] == plain
    assert all(o.error is None for o in outputs)
    assert spec.stats.draft_tokens > spec.stats.accepted_draft_tokens > 0


def test_chunked_prefill_equals_unchunked(f64: dict[str, LLM]) -> None:
    long_prompts = [p * 6 for p in F64_PROMPTS]
    plain = [o.token_ids for o in f64["plain"].generate(long_prompts, F64_PARAMS)]
    chunked = LLM(
        "tiny-random", max_num_seqs=3, max_num_tokens=5, dtype="float64", json_whitespace="compact"
    )
    assert [o.token_ids for o in chunked.generate(long_prompts, F64_PARAMS)] == plain


def test_disaggregated_handoff_equals_one_engine(f64: dict[str, LLM]) -> None:
    plain = f64["plain"].generate(F64_PROMPTS, F64_PARAMS)
    prefill = LLM("tiny-random", max_num_seqs=2, dtype="float64", json_whitespace="compact")
    handoffs = prefill.prefill(F64_PROMPTS, F64_PARAMS)
    assert all(h.output is None and h.kv_cache is not None for h in handoffs)
    continued = f64["draft"].generate_from_handoff(handoffs)
    assert [o.token_ids for o in continued] == [o.token_ids for o in plain]
    assert [o.finish_reason for o in continued] == [o.finish_reason for o in plain]


def test_request_stop_tokens_add_to_the_tokenizers(llm: LLM) -> None:
    free = llm.generate(PROMPTS[1], SamplingParams(max_tokens=12))[0]
    stop = free.token_ids[5]
    first = free.token_ids.index(stop)
    stopped = llm.generate(PROMPTS[1], SamplingParams(max_tokens=12, stop_token_ids=[stop]))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:first]


def test_requests_with_the_same_guide_share_one_compilation(llm: LLM) -> None:
    slow = SlowFactory(llm.grammars.factory, delay_s=0.3)
    llm.grammars.factory = slow
    try:
        guide = GuidedDecodingParams(regex="(on|off)-[0-9]")
        outputs = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=8, guided_decoding=guide))
    finally:
        llm.grammars.factory = slow.inner
    assert slow.calls == 1
    assert all(
        o.finish_reason == "stop" and re.fullmatch("(on|off)-[0-9]", o.text) for o in outputs
    )


class CountingFactory(WrappedFactory):
    """Counts the compiles and the matchers made through it."""

    def __init__(self, inner: GrammarMatcherFactory) -> None:
        super().__init__(inner)
        self.compiles = self.creates = 0

    def compile(self, params: GuidedDecodingParams) -> object:
        self.compiles += 1
        return self.inner.compile(params)

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        self.creates += 1
        return self.inner.create(params)


def test_the_pool_compiles_and_the_decoder_makes_one_matcher_per_request(llm: LLM) -> None:
    counting = CountingFactory(llm.factory)
    decoder_factory = llm.decoder.factory
    llm.grammars.factory = llm.decoder.factory = counting
    try:
        guides = [GuidedDecodingParams(regex="(up|down)-[0-9]"), GuidedDecodingParams(regex="z+")]
        params = [SamplingParams(max_tokens=8, guided_decoding=guides[i % 2]) for i in range(3)]
        outputs = llm.generate(PROMPTS[:3], [*params, SamplingParams(max_tokens=4)][:3])
    finally:
        llm.grammars.factory, llm.decoder.factory = llm.factory, decoder_factory
    assert all(o.error is None for o in outputs)
    assert counting.compiles == 2  # one per distinct guide, on the pool
    assert counting.creates == 3  # one matcher per guided request, in the decoder


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculative_sampling_follows_the_grammar(f64: dict[str, LLM], mode: str) -> None:
    params = [
        SamplingParams(max_tokens=30, temperature=1.0, top_k=50, seed=i, guided_decoding=guide)
        for i, guide in enumerate([GUIDES["json_schema"], GUIDES["ebnf"], GUIDES["regex"]])
    ]
    spec = f64[mode]
    outputs = spec.generate(F64_PROMPTS, params)
    again = spec.generate(F64_PROMPTS, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in again]
    for out, p in zip(outputs, params, strict=True):
        assert p.guided_decoding is not None and out.error is None
        assert follows(spec, p.guided_decoding, out.token_ids, out.finish_reason == "stop")


def test_a_sampled_request_continues_after_a_handoff_with_speculation(f64: dict[str, LLM]) -> None:
    prefill = LLM("tiny-random", max_num_seqs=1, dtype="float64", json_whitespace="compact")
    params = SamplingParams(
        max_tokens=20, temperature=1.0, seed=3, guided_decoding=GUIDES["json_schema"]
    )
    [handoff] = prefill.prefill(F64_PROMPTS[:1], params)
    [out] = f64["draft"].generate_from_handoff([handoff])
    assert out.error is None and out.token_ids[0] == handoff.first_token
    assert follows(f64["draft"], GUIDES["json_schema"], out.token_ids, out.finish_reason == "stop")


def test_bad_prompts_are_refused_before_anything_is_queued(llm: LLM) -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        llm.generate(["ok", ""])
    with pytest.raises(ValueError, match="prompt 0 has 5000 tokens"):
        llm.generate([[5] * 5000])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 10**7]])
    with pytest.raises(ValueError, match="2 prompts but 1 sampling params"):
        llm.generate(["a", "b"], [SamplingParams()])
    with pytest.raises(ValueError, match="the prompt is empty"):
        llm.add_request("")
    assert not llm.has_unfinished_requests()
