"""Reasoning models: the thinking is free, the guide starts after ``</think>`` (float64 greedy,
the same request fed its own thinking as a prompt as the oracle), in the engine and served."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.engine.reasoning import ReasoningParser
from guidedec.server import create_app
from live_server import serve

END = 128822  # </think> in the bundled tokenizer
START = 128821  # <think>
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
GUIDES = {
    "json": GuidedDecodingParams(json_schema=PERSON),
    "regex": GuidedDecodingParams(regex="[0-9]{3}"),
    "choice": GuidedDecodingParams(choice=["north", "south"]),
}
CHECKS = {
    "json": lambda t: jsonschema.validate(json.loads(t), PERSON) is None,
    "regex": lambda t: re.fullmatch("[0-9]{3}", t),
    "choice": lambda t: t in ("north", "south"),
}


def _llm(parser: str | None = "deepseek_r1", **options: object) -> LLM:
    return LLM(
        "tiny-random",
        max_num_seqs=4,
        dtype=torch.float64,
        json_whitespace="compact",
        isolate_compiles=False,
        reasoning_parser=parser,  # type: ignore[arg-type]
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    engine = _llm()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plain() -> Iterator[LLM]:
    engine = _llm(None)
    yield engine
    engine.close()


@pytest.mark.parametrize("name", sorted(GUIDES))
def test_the_guide_starts_after_the_thinking(llm: LLM, plain: LLM, name: str) -> None:
    params = SamplingParams(max_tokens=60, thinking_token_budget=6, guided_decoding=GUIDES[name])
    out = llm.generate(["Think first:"], params)[0]
    assert out.finish_reason == "stop", out
    assert CHECKS[name](out.text), out.text
    end = out.token_ids.index(END)
    assert end == 6 and out.reasoning == llm.tokenizer.decode(out.token_ids[:end])
    assert not CHECKS["regex"](out.reasoning)  # the thinking was not guided
    # The oracle: the same thinking given as the prompt of an engine without a parser.
    prompt = [*out.prompt_token_ids, *out.token_ids[: end + 1]]
    again = plain.generate([prompt], SamplingParams(max_tokens=60, guided_decoding=GUIDES[name]))
    assert again[0].token_ids == out.token_ids[end + 1 :]
    assert again[0].text == out.text


def test_a_stop_token_while_thinking_ends_the_thinking_of_a_guided_request(
    llm: LLM, plain: LLM
) -> None:
    free = plain.generate(["Think first:"], SamplingParams(max_tokens=8))[0].token_ids
    stop = free[3]
    assert stop not in free[:3]
    guided = SamplingParams(max_tokens=60, stop_token_ids=[stop], guided_decoding=GUIDES["regex"])
    out = llm.generate(["Think first:"], guided)[0]
    assert out.token_ids[:4] == [*free[:3], END] and CHECKS["regex"](out.text)
    unguided = llm.generate(["Think first:"], SamplingParams(max_tokens=60, stop_token_ids=[stop]))
    assert unguided[0].finish_reason == "stop" and unguided[0].token_ids == free[:3]
    assert unguided[0].text == "" and unguided[0].reasoning == plain.tokenizer.decode(free[:3])


def test_budget_zero_and_a_prompt_that_closed_the_thinking(llm: LLM) -> None:
    params = SamplingParams(max_tokens=30, thinking_token_budget=0, guided_decoding=GUIDES["json"])
    out = llm.generate(["Answer:"], params)[0]
    assert out.token_ids[0] == END and out.reasoning == "" and CHECKS["json"](out.text)
    closed = llm.generate(
        [[5, 6, START, END]], SamplingParams(max_tokens=30, guided_decoding=GUIDES["regex"])
    )
    assert END not in closed[0].token_ids and closed[0].reasoning is None
    assert CHECKS["regex"](closed[0].text)


def test_a_budget_that_runs_out_while_thinking_says_so(llm: LLM) -> None:
    out = llm.generate(["Think:"], SamplingParams(max_tokens=8, guided_decoding=GUIDES["json"]))[0]
    assert out.finish_reason == "length" and END not in out.token_ids
    assert out.incomplete is not None and "while thinking" in out.incomplete
    assert out.text == "" and out.reasoning


@pytest.mark.parametrize(
    "options",
    [{"jump_forward": True}, {"overlap": False}, {"cuda_graphs": True}, {"speculative": "ngram"}],
)
def test_the_same_outputs_with_every_engine_path(llm: LLM, options: dict[str, object]) -> None:
    """A batch of guided and unguided requests, thinking budgets apart."""
    params = [
        SamplingParams(max_tokens=50, thinking_token_budget=b, guided_decoding=g)
        for b, g in ((3, GUIDES["json"]), (5, GUIDES["regex"]), (2, None), (4, GUIDES["choice"]))
    ]
    prompts = [f"Request {i}:" for i in range(4)]
    expected = [o.token_ids for o in llm.generate(prompts, params)]
    other = _llm(**options)
    assert [o.token_ids for o in other.generate(prompts, params)] == expected
    other.close()


def test_qwen3_parts_an_output_without_think_as_content() -> None:
    from guidedec.tokenizer import TokenizerInfo

    parser = ReasoningParser.create("qwen3", TokenizerInfo.default())
    assert parser.split([7, 8, 9], None, True) == (None, [7, 8, 9])
    assert parser.split([START, 7, 8], None, True) == ([7, 8], [])
    assert parser.split([START, 7, END, 9], 2, True) == ([7], [9])
    r1 = ReasoningParser.create("deepseek_r1", TokenizerInfo.default())
    assert r1.split([7, 8, 9], None, True) == ([7, 8, 9], [])
    with pytest.raises(ValueError, match="reasoning_parser"):
        ReasoningParser.create("o1", TokenizerInfo.default())


# --- served ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    engine = LLM("tiny-random", max_num_seqs=4, json_whitespace="compact", reasoning_parser="qwen3")
    yield from serve(create_app(engine))


def test_served_reasoning_content_streaming_or_not(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=120)
    request = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "A person."}],
        "max_tokens": 60,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        "extra_body": {"thinking_token_budget": 5},
    }
    out = client.chat.completions.create(**request)  # type: ignore[call-overload]
    message = out.choices[0].message.model_dump()
    assert message["reasoning_content"] and CHECKS["json"](message["content"])
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(**request, stream=True):  # type: ignore[call-overload]
        delta = chunk.choices[0].delta.model_dump()
        if delta.get("reasoning_content"):
            assert not content, "reasoning after content"
            reasoning += delta["reasoning_content"]
        content += delta.get("content") or ""
    assert (reasoning, content) == (message["reasoning_content"], message["content"])


def test_thinking_token_budget_needs_a_parser() -> None:
    engine = LLM("tiny-random", max_num_seqs=1)
    for url in serve(create_app(engine)):
        body = {"model": "tiny-random", "prompt": "x", "thinking_token_budget": 3}
        response = httpx.post(f"{url}/v1/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "thinking_token_budget"
