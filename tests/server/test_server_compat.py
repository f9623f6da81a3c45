"""What a vLLM user sends, served as vLLM serves it: a live server on a free loopback port,
driven by the official ``openai`` client and by raw HTTP."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from test_server import PERSON, TAG, WEATHER_TOOL

import guidedec
from guidedec import LLM
from guidedec.server import create_app
from guidedec.server.app import DEFAULT_CHAT_TOKENS
from guidedec.server.protocol import UNSUPPORTED
from live_server import serve

KEY = "sk-test-key"
MODEL = "tiny-random"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    llm = LLM(MODEL, max_num_seqs=8, json_whitespace="compact")
    yield from serve(create_app(llm))


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def _post(server: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server}{path}", json={"model": MODEL, **body}, timeout=120)


# --- shapes ----------------------------------------------------------------------------------


def test_an_unknown_model_is_a_404_as_in_vllm(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["message"] == "The model `gpt-4o` does not exist."
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)


def test_unknown_paths_and_methods_get_an_error_object(server: str) -> None:
    missing = httpx.get(f"{server}/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NotFoundError"
    wrong = httpx.get(f"{server}/v1/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == 405


def test_a_malformed_body_names_no_character_offset_as_a_param(server: str) -> None:
    response = httpx.post(
        f"{server}/v1/completions",
        content=b'{"model": "tiny-random", "prompt": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] is None
    assert error["message"].startswith("the request body is not valid JSON")


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
def test_options_guidedec_does_not_implement_are_refused_by_name(server: str, field: str) -> None:
    response = _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, field: 0.5})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and "not supported" in error["message"]


def test_unsupported_options_at_their_defaults_pass(server: str) -> None:
    defaults = {"presence_penalty": 0, "frequency_penalty": 0.0, "best_of": 1, "ignore_eos": False}
    response = _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, **defaults})
    assert response.status_code == 200, response.text


def test_version_tokenize_detokenize(server: str) -> None:
    assert httpx.get(f"{server}/version").json() == {"version": guidedec.__version__}
    tokens = _post(server, "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    body = tokens.json()
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) > 0
    assert body["max_model_len"] > 0
    text = _post(server, "/detokenize", {"tokens": body["tokens"]}).json()["prompt"]
    assert text.endswith("Hello world")
    chat = _post(server, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > 1
    bad = _post(server, "/detokenize", {"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_metrics_count_what_was_served(server: str, client: openai.OpenAI) -> None:
    def generated() -> int:
        text = httpx.get(f"{server}/metrics").text
        found = re.search(r"^guidedec:generation_tokens_total\{[^}]*\} (\d+)$", text, re.M)
        assert found, text
        return int(found.group(1))

    before = generated()
    out = client.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0)
    assert generated() == before + out.usage.completion_tokens  # type: ignore[union-attr]
    text = httpx.get(f"{server}/metrics").text
    assert "# TYPE guidedec:e2e_request_latency_seconds histogram" in text
    assert re.search(r'guidedec:request_success_total\{.*finished_reason="length"\} [1-9]', text)


# --- guides under other servers' names ------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "check"),
    [
        ("guided_json", PERSON, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
        ("guided_regex", "(yes|no)-[0-9]", lambda t: re.fullmatch("(yes|no)-[0-9]", t)),
        ("guided_choice", ["red", "blue"], lambda t: t in ("red", "blue")),
        ("guided_grammar", 'root ::= "(" [a-c] ")"', lambda t: re.fullmatch(r"\([a-c]\)", t)),
        ("regex", "[0-9]{3}", lambda t: re.fullmatch("[0-9]{3}", t)),  # SGLang
        ("ebnf", 'root ::= "<" [x-z] ">"', lambda t: re.fullmatch("<[x-z]>", t)),  # SGLang
        ("json_schema", json.dumps(PERSON), lambda t: json.loads(t)["age"] >= 0),  # SGLang
    ],
)
def test_top_level_guide_fields_constrain_the_output(
    client: openai.OpenAI, field: str, value: Any, check: Any
) -> None:
    out = client.completions.create(
        model=MODEL, prompt="Answer:", max_tokens=40, temperature=0, extra_body={field: value}
    )
    assert out.choices[0].finish_reason == "stop"
    assert check(out.choices[0].text), out.choices[0].text


def test_two_guides_in_one_request_are_refused(server: str) -> None:
    body = {"prompt": "x", "guided_regex": "a", "response_format": {"type": "json_object"}}
    response = _post(server, "/v1/completions", body)
    assert response.status_code == 400 and "both constrain" in response.json()["error"]["message"]


def test_response_format_structural_tag(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tag it."}],
        max_tokens=20,
        temperature=0,
        response_format=TAG,  # type: ignore[arg-type]
    )
    assert out.choices[0].message.content in ('<a>"x"</a>', '<a>"y"</a>')


# --- options that used to be ignored ---------------------------------------------------------


def test_stop_strings_cut_the_text_streaming_or_not(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="Once", max_tokens=24, temperature=0)
    text = free.choices[0].text
    stop = text[10:13]
    assert len(stop) == 3 and stop not in text[:10]
    cut = client.completions.create(
        model=MODEL, prompt="Once", max_tokens=24, temperature=0, stop=[stop, "never seen"]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=MODEL, prompt="Once", max_tokens=24, temperature=0, stop=stop, stream=True
    )
    pieces = list(stream)
    assert "".join(p.choices[0].text for p in pieces) == cut.choices[0].text
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_a_stop_string_that_cuts_a_guided_output_says_so(server: str) -> None:
    body = {"prompt": "x", "max_tokens": 40, "temperature": 0, "guided_json": PERSON}
    whole = _post(server, "/v1/completions", body).json()["choices"][0]
    assert "incomplete" not in whole
    cut = _post(server, "/v1/completions", {**body, "stop": ['"age"']}).json()["choices"][0]
    assert cut["text"] == whole["text"][: whole["text"].index('"age"')]
    assert "stop string" in cut["incomplete"]


def test_n_choices_each_valid_and_its_own_sequence(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A person."}],
        max_tokens=60,
        temperature=1.0,
        seed=7,
        n=4,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    texts = [c.message.content or "" for c in out.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1  # seeds 7, 8, 9, 10
    assert out.usage is not None and out.usage.completion_tokens > 4 * 2


def test_a_list_of_prompts_and_n_give_choices_prompt_major(client: openai.OpenAI) -> None:
    prompts = ["Red or blue?", "Blue or red?"]
    out = client.completions.create(
        model=MODEL,
        prompt=prompts,
        max_tokens=4,
        temperature=0,
        n=2,
        extra_body={"guided_choice": ["red", "blue"]},
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    alone = [
        client.completions.create(
            model=MODEL,
            prompt=p,
            max_tokens=4,
            temperature=0,
            extra_body={"guided_choice": ["red", "blue"]},
        )
        .choices[0]
        .text
        for p in prompts
    ]
    assert [c.text for c in out.choices] == [alone[0], alone[0], alone[1], alone[1]]
    ids = client.completions.create(model=MODEL, prompt=[[1, 2, 3], [4, 5]], max_tokens=2)
    assert len(ids.choices) == 2
    assert ids.usage is not None and ids.usage.prompt_tokens == 5


def test_echo_prepends_the_prompt(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL, prompt="Echo:", max_tokens=4, temperature=0)
    echoed = client.completions.create(
        model=MODEL, prompt="Echo:", max_tokens=4, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "Echo:" + plain.choices[0].text


def test_stream_options_include_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


def test_logprobs_on_both_endpoints(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL, prompt="x", max_tokens=5, temperature=0, logprobs=2
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == out.choices[0].text
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    for lp, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top is not None and len(top) == 2
        assert lp == pytest.approx(max(top.values()))  # greedy: the likeliest token
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Pick."}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and content
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    for entry in content:
        assert 1 <= len(entry.top_logprobs) <= 3  # a guided row allows few tokens
        assert entry.logprob <= 0 and entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


def test_a_chat_request_without_max_tokens_ends_within_the_default(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Talk."}], temperature=0
    )
    assert out.usage is not None and out.usage.completion_tokens <= DEFAULT_CHAT_TOKENS


# --- tool calls, streamed --------------------------------------------------------------------


# --- access ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[str]:
    llm = LLM(MODEL, max_num_seqs=2)
    yield from serve(create_app(llm, api_key=KEY, allowed_origins=["https://app.example"]))


def test_an_api_key_guards_v1_and_leaves_health_open(guarded: str) -> None:
    assert httpx.get(f"{guarded}/health").status_code == 200
    refused = httpx.get(f"{guarded}/v1/models")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded}/v1", api_key="wrong", max_retries=0).models.list()
    ok = openai.OpenAI(base_url=f"{guarded}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in ok.models.list().data] == [MODEL]


def test_cors_preflight_answers_the_allowed_origin_only(guarded: str) -> None:
    headers = {"origin": "https://app.example", "access-control-request-method": "POST"}
    allowed = httpx.options(f"{guarded}/v1/completions", headers=headers)
    assert allowed.headers.get("access-control-allow-origin") == "https://app.example"
    other = httpx.options(
        f"{guarded}/v1/completions", headers={**headers, "origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers


# --- lifecycle and load ----------------------------------------------------------------------


def _idle(server: str, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while httpx.get(f"{server}/health").json()["active_requests"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_streaming_client_that_leaves_aborts_every_choice(server: str) -> None:
    body = {"model": MODEL, "prompt": "A long story:", "max_tokens": 3000, "n": 3, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        assert httpx.get(f"{server}/health").json()["active_requests"] == 3
    assert _idle(server), "the abandoned choices are still counted"


def test_64_concurrent_clients_mixing_every_option(server: str) -> None:
    """Every option at once, under load: only the intended 4xx, every guided output valid,
    nothing left running, and the server's memory growth bounded (printed)."""
    import psutil  # the server runs in this process: its RSS is ours

    rss_before = psutil.Process().memory_info().rss
    schema = {"name": "p", "schema": PERSON}
    bodies: list[tuple[str, dict[str, Any], int]] = []
    for i in range(64):
        kind = i % 8
        base: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "seed": i, "temperature": 1.0}
        if kind == 0:
            bodies.append(("/v1/completions", {**base, "prompt": ["a", "b"], "n": 2}, 200))
        elif kind == 1:
            chat = {"messages": [{"role": "user", "content": "x"}], "logprobs": True}
            bodies.append(("/v1/chat/completions", {**base, **chat, "top_logprobs": 2}, 200))
        elif kind == 2:
            rf = {"type": "json_schema", "json_schema": schema}
            msgs = [{"role": "user", "content": "p"}]
            body = {**base, "messages": msgs, "response_format": rf, "n": 2, "max_tokens": 60}
            bodies.append(("/v1/chat/completions", body, 200))
        elif kind == 3:
            body = {**base, "prompt": "s", "stop": ["a", "e"], "stream": True, "echo": True}
            bodies.append(
                ("/v1/completions", {**body, "stream_options": {"include_usage": True}}, 200)
            )
        elif kind == 4:
            bodies.append(
                ("/v1/completions", {**base, "prompt": "g", "guided_regex": "[0-9]{4}"}, 200)
            )
        elif kind == 5:
            bodies.append(("/v1/completions", {**base, "prompt": "x", "presence_penalty": 1}, 400))
        elif kind == 6:
            bodies.append(("/v1/completions", {**base, "prompt": "x", "model": "other"}, 404))
        else:
            tools = {"tools": [WEATHER_TOOL], "tool_choice": "required", "stream": True}
            msgs = [{"role": "user", "content": "w"}]
            bodies.append(
                ("/v1/chat/completions", {**base, "messages": msgs, **tools, "max_tokens": 60}, 200)
            )
    results: list[tuple[int, int, str, dict[str, Any]]] = []
    lock = threading.Lock()

    def run(path: str, body: dict[str, Any], expected: int) -> None:
        response = httpx.post(f"{server}{path}", json=body, timeout=300)
        with lock:
            results.append((expected, response.status_code, response.text, body))

    threads = [threading.Thread(target=run, args=b) for b in bodies]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    took = time.monotonic() - start
    assert len(results) == 64
    assert [(e, s) for e, s, _, _ in results if e != s] == []
    for expected, _, text, sent in results:
        if expected != 200:
            continue
        if sent.get("stream"):
            assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text
            continue
        choices = json.loads(text)["choices"]
        assert len(choices) == (4 if isinstance(sent.get("prompt"), list) else sent.get("n", 1))
        for choice in choices:
            if "response_format" in sent:
                jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
            if "guided_regex" in sent:
                assert re.fullmatch("[0-9]{4}", choice["text"]), choice
    assert _idle(server)
    growth = (psutil.Process().memory_info().rss - rss_before) / 2**20
    print(f"64 clients in {took:.1f} s; server RSS growth {growth:.0f} MiB")
    assert growth < 512


def test_streamed_choices_carry_their_index(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Two."}],
            max_tokens=8,
            temperature=1.0,
            seed=1,
            n=2,
            stream=True,
        )
    )
    texts = {0: "", 1: ""}
    ends = {}
    for chunk in chunks:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            ends[choice.index] = choice.finish_reason
    assert ends == {0: "length", 1: "length"}
    whole = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Two."}],
        max_tokens=8,
        temperature=1.0,
        seed=1,
        n=2,
    )
    assert [c.message.content for c in whole.choices] == [texts[0], texts[1]]
