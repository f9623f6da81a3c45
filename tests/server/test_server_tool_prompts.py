"""The server shows tools to the model and keeps a tool conversation's history (the prompt is
read back through ``/tokenize`` and ``/detokenize``); a message field it cannot render is a 400
naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from guidedec import LLM
from guidedec.server import create_app
from guidedec.tokenizer import TokenizerInfo
from live_server import serve

MODEL = "tiny-random"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Lisbon?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_42",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_42", "name": "get_weather", "content": "21 C"},
]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from serve(create_app(LLM(MODEL, max_num_seqs=4), enable_auto_tool_choice=True))


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def _prompt(server: str, body: dict[str, Any]) -> str:
    tokens = httpx.post(f"{server}/tokenize", json=body, timeout=60)
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    return str(httpx.post(f"{server}/detokenize", json={"tokens": ids}).json()["prompt"])


def test_the_prompt_holds_the_tools(server: str, client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "Weather in Lisbon?"}]
    prompt = _prompt(server, {"messages": ask, "tools": [WEATHER]})
    assert json.dumps(WEATHER) in prompt
    bare = client.chat.completions.create(
        model=MODEL,
        messages=ask,  # type: ignore[arg-type]
        max_tokens=2,
    )
    shown = client.chat.completions.create(
        model=MODEL,
        messages=ask,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=2,
    )
    assert bare.usage is not None and shown.usage is not None
    usage = {True: bare.usage.prompt_tokens, False: shown.usage.prompt_tokens}
    assert usage[False] > usage[True] + 20  # the definition is in the prompt


def test_a_two_turn_tool_conversation_keeps_its_ids(server: str, client: openai.OpenAI) -> None:
    prompt = _prompt(server, {"messages": HISTORY, "tools": [WEATHER]})
    call = '{"name": "get_weather", "arguments": {"city": "Lisbon"}}'
    assert f"<tool_call>\n{call}\n</tool_call>" in prompt
    assert '{"name": "get_weather", "tool_call_id": "call_42"}\n21 C' in prompt
    out = client.chat.completions.create(
        model=MODEL,
        messages=HISTORY,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=4,
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.prompt_tokens == len(
        httpx.post(f"{server}/tokenize", json={"messages": HISTORY, "tools": [WEATHER]}).json()[
            "tokens"
        ]
    )


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": "hi", "audio": {"id": "a1"}}], "messages[0].audio"),
        (
            [
                HISTORY[0],
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}],
                },
            ],
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_a_message_field_that_cannot_be_rendered_is_a_400_naming_it(
    client: openai.OpenAI, messages: list[dict[str, Any]], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=2,
        )
    assert param in str(caught.value)


def test_a_bad_tool_schema_is_a_400_naming_it(client: openai.OpenAI) -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=HISTORY[:1],  # type: ignore[arg-type]
            tools=[bad],  # type: ignore[list-item]
            max_tokens=2,
        )
    assert "tools[0].function.parameters" in str(caught.value)


# A template that shows which of its inputs reached it.
ECHO_TEMPLATE = (
    "[{{ greeting | default('no kwargs') }}]{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_request_s_chat_template_kwargs_and_generation_prompt_reach_the_template(
    client: openai.OpenAI,
) -> None:
    ask = [{"role": "user", "content": "hi"}]
    with_kwargs = client.chat.completions.create(
        model=MODEL,
        messages=ask,  # type: ignore[arg-type]
        max_tokens=1,
        extra_body={"chat_template": ECHO_TEMPLATE, "chat_template_kwargs": {"greeting": "hello"}},
    )
    without = client.chat.completions.create(
        model=MODEL,
        messages=ask,  # type: ignore[arg-type]
        max_tokens=1,
        extra_body={"chat_template": ECHO_TEMPLATE, "add_generation_prompt": False},
    )
    tokenizer = TokenizerInfo.default()  # tiny-random's
    expected = {"[hello]<user>hi<assistant>": with_kwargs, "[no kwargs]<user>hi": without}
    for text, out in expected.items():
        assert out.usage is not None
        assert out.usage.prompt_tokens == len(tokenizer.encode(text)), text


def test_the_server_s_chat_template_serves_requests_that_give_none() -> None:
    app = create_app(LLM(MODEL, max_num_seqs=2), chat_template=ECHO_TEMPLATE)
    for url in serve(app):
        rendered = _prompt(url, {"messages": [{"role": "user", "content": "hi"}]})
        assert rendered.endswith("[no kwargs]<user>hi<assistant>")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"chat_template": "{% for m in messages %}"}, "the chat template failed"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    ],
)
def test_a_chat_template_that_fails_is_a_400(
    client: openai.OpenAI, extra: dict[str, Any], says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=HISTORY[:1],  # type: ignore[arg-type]
            max_tokens=1,
            extra_body={"chat_template": ECHO_TEMPLATE, **extra},
        )
    assert says in str(caught.value)
