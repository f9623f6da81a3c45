"""Chat rendering with tools: templates of the common families (small ones written here), and
the text fallback for a template that renders no tools."""

from __future__ import annotations

import json
from typing import Any

import pytest

from guidedec.engine.chat import render_chat, renders_tools
from guidedec.tokenizer import TokenizerInfo

# Qwen2.5 / Hermes style: tools in the system turn, calls as <tool_call> JSON, results as
# user turns holding <tool_response>.
HERMES = """{%- if tools %}<|im_start|>system
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}{%- for m in messages %}{%- if m.role == 'tool' %}<|im_start|>user
<tool_response name={{ m.name }} id={{ m.tool_call_id }}>{{ m.content }}</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{"id": "{{ c.id }}", "name": "{{ c.function.name }}", \
"arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Llama 3.1 JSON style: tools in the first user turn, calls as bare JSON with "parameters",
# results under the "ipython" role.
LLAMA3 = """{%- for m in messages %}<|start_header_id|>\
{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>
{% if loop.first and tools %}Functions: {{ tools | map(attribute='function.name') | join(',') }}
{% endif %}{%- if m.tool_calls %}{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", \
"parameters": {{ c.function.arguments | tojson }}}{% endfor %}{% else %}{{ m.content }}{% endif %}\
<|eot_id|>{%- endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant\
<|end_header_id|>
{% endif %}"""

# SmolLM2's own: no tools at all.
PLAIN = """{% for message in messages %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

TWO_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Lisbon?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_7", "name": "get_weather", "content": "21 C, sun"},
]


@pytest.fixture(scope="module")
def hf() -> Any:
    return TokenizerInfo.default().hf_tokenizer


def test_a_hermes_template_gets_the_tools_the_calls_and_the_results(hf: Any) -> None:
    text = render_chat(TWO_TURNS, hf, chat_template=HERMES, tools=[WEATHER])
    assert json.dumps(WEATHER) in text  # the definition, whole
    # The call's arguments arrive as an object (the client sent a JSON string), with its id.
    assert '<tool_call>{"id": "call_7", "name": "get_weather", "arguments": {"city": ' in text
    assert "<tool_response name=get_weather id=call_7>21 C, sun</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_llama3_template_gets_them_in_its_own_shape(hf: Any) -> None:
    text = render_chat(TWO_TURNS, hf, chat_template=LLAMA3, tools=[WEATHER])
    assert "Functions: get_weather\n" in text
    assert '{"name": "get_weather", "parameters": {"city": "Lisbon"}}' in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n21 C, sun<|eot_id|>" in text
    no_gen = render_chat(TWO_TURNS, hf, chat_template=LLAMA3, add_generation_prompt=False)
    assert no_gen.endswith("21 C, sun<|eot_id|>") and "Functions" not in no_gen


def test_a_template_without_tools_gets_them_as_text(hf: Any) -> None:
    assert not renders_tools(PLAIN) and renders_tools(HERMES)
    text = render_chat(
        [{"role": "system", "content": "Be brief."}, *TWO_TURNS],
        hf,
        chat_template=PLAIN,
        tools=[WEATHER],
    )
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n")
    assert f"<tools>\n{json.dumps(WEATHER)}\n</tools>" in system
    assert "<tool_call>" in system  # the instruction shows the call format
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in text
    response = '{"name": "get_weather", "tool_call_id": "call_7"}\n21 C, sun'
    assert f"<|im_start|>user\n<tool_response>\n{response}\n</tool_response>" in text
    # Without tools and without tool messages, nothing is added.
    plain = render_chat(TWO_TURNS[:1], hf, chat_template=PLAIN)
    assert plain == "<|im_start|>user\nWeather in Lisbon?<|im_end|>\n<|im_start|>assistant\n"


def test_a_model_without_a_template_gets_the_tools_in_a_system_line(hf: Any) -> None:
    assert getattr(hf, "chat_template", None) is None
    text = render_chat(TWO_TURNS[:1], hf, tools=[WEATHER])
    assert text.startswith("<|system|>\n") and json.dumps(WEATHER) in text
    assert text.endswith("<|user|>\nWeather in Lisbon?\n<|assistant|>\n")


@pytest.mark.parametrize(
    ("message", "names"),
    [
        ({"role": "user", "content": "hi", "audio": {"id": "a"}}, "messages[0].audio"),
        ({"role": "user", "content": "hi", "tool_calls": []}, None),
        (
            {"role": "user", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
            "messages[0].tool_calls",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"role": "tool", "content": "x", "tool_call_id": 7}, "messages[0].tool_call_id"),
    ],
)
def test_a_field_that_cannot_be_rendered_is_an_error_naming_it(
    hf: Any, message: dict[str, Any], names: str | None
) -> None:
    if names is None:  # an empty list of calls is no call: rendered as the text it has
        assert "hi" in render_chat([message], hf, chat_template=HERMES)
        return
    with pytest.raises(ValueError, match=names.replace("[", r"\[").replace("]", r"\]")):
        render_chat([message], hf, chat_template=HERMES)


@pytest.mark.parametrize(
    ("template", "kwargs", "says"),
    [
        ("{% for m in messages %}{{ m.content }", None, "TemplateSyntaxError"),
        ("{{ raise_exception('no tools here') }}", None, "no tools here"),
        ("{{ undefined_thing.attribute }}", None, "UndefinedError"),
        ("{{ greeting }}", {"tokenize": True}, "chat_template_kwargs.tokenize"),
        ("{{ greeting }}", {"return_dict": True}, "chat_template_kwargs.return_dict"),
    ],
)
def test_a_template_that_fails_or_a_renderer_argument_is_a_value_error(
    hf: Any, template: str, kwargs: dict[str, Any] | None, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        render_chat(TWO_TURNS[:1], hf, chat_template=template, chat_template_kwargs=kwargs)
    assert (
        render_chat(
            TWO_TURNS[:1],
            hf,
            chat_template="{{ greeting }}",
            chat_template_kwargs={"greeting": "x"},
        )
        == "x"
    )
