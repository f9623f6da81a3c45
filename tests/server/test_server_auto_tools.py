"""``tool_choice="auto"`` on the real model, in each call format: a tool conversation rendered
by a small template of the format's family teaches the model the format; asked again, it
writes a call, which comes back parsed and schema-valid, streamed or not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from guidedec import LLM
from guidedec.engine import gguf
from guidedec.server import create_app
from live_server import serve

pytestmark = pytest.mark.real

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
_TURNS = """
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
CALLS<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
Result: {{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
_TOOLS = """<|im_start|>system
You call functions. {% for t in tools %}{{ t | tojson }} {% endfor %}<|im_end|>
"""
CALLS = {
    "hermes": "{% for c in m.tool_calls %}<tool_call>\n"
    '{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}\n'
    "</tool_call>{% endfor %}",
    "llama3_json": "{% for c in m.tool_calls %}"
    '{{ {"name": c.function.name, "parameters": c.function.arguments} | tojson }}'
    "{% endfor %}",
    "mistral": "[TOOL_CALLS][{% for c in m.tool_calls %}"
    '{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}'
    "{% endfor %}]",
    "pythonic": "[{% for c in m.tool_calls %}"
    "{{ c.function.name }}({% for k, v in c.function.arguments.items() %}"
    "{{ k }}={{ v | tojson }}{% endfor %}){% endfor %}]",
}
TEMPLATES = {name: _TOOLS + _TURNS.replace("CALLS", calls) for name, calls in CALLS.items()}
TEMPLATES["pythonic"] = TEMPLATES["pythonic"].replace(
    "You call functions.", "You call functions as [func_name1(params_name1=params_value1)]."
)
ASKED = [
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    llm = LLM(gguf.SMOLLM2, max_num_seqs=4, isolate_compiles=False)
    for url in serve(create_app(llm, enable_auto_tool_choice=True)):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def _create(client: openai.OpenAI, parser: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=gguf.SMOLLM2,
        messages=ASKED,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=48,
        temperature=0,
        extra_body={"chat_template": TEMPLATES[parser]},
        **kwargs,
    )


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_auto_calls_come_back_parsed_and_valid_streamed_or_not(
    client: openai.OpenAI, parser: str
) -> None:
    whole = _create(client, parser)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])  # type: ignore[index]
    names, pieces, reasons, ids = [], [], [], set()
    for chunk in _create(client, parser, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            assert part.index == 0
            if part.id:
                ids.add(part.id)
                names.append(part.function.name)
            pieces.append(part.function.arguments or "")
        reasons.append(chunk.choices[0].finish_reason)
    assert names == ["get_weather"] and len(ids) == 1
    assert json.loads("".join(pieces)) == arguments
    assert reasons[-1] == "tool_calls"


def test_the_sdk_stream_helper_reads_streamed_calls(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=gguf.SMOLLM2,
        messages=ASKED,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
        temperature=0,
    ) as stream:
        argument_events = sum(
            1 for event in stream if event.type == "tool_calls.function.arguments.delta"
        )
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and argument_events > 1
    (call,) = choice.message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]


def test_auto_answers_in_text_when_no_call_is_wanted(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=gguf.SMOLLM2,
        messages=[{"role": "user", "content": "Say hello in French."}],
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=24,
        temperature=0,
    )
    choice = out.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")


RENDERED = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Lisbon"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lisbon"}}]',
    "pythonic": '[get_weather(city="Lisbon")]',
}


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_each_family_s_template_renders_the_history_s_call_in_its_format(
    client: openai.OpenAI, parser: str
) -> None:
    base = str(client.base_url).removesuffix("/v1/")
    body = {"messages": ASKED, "tools": [WEATHER], "chat_template": TEMPLATES[parser]}
    tokens = httpx.post(f"{base}/tokenize", json=body, timeout=60).json()["tokens"]
    prompt = httpx.post(f"{base}/detokenize", json={"tokens": tokens}, timeout=60).json()["prompt"]
    assert f"<|im_start|>assistant\n{RENDERED[parser]}<|im_end|>" in prompt
    assert json.dumps(WEATHER) in prompt and "Result: 21 C, sunny" in prompt
