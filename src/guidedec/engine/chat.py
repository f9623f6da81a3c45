"""Chat messages to a prompt, one rendering for ``LLM.chat``, the CLI's chat mode and the server:
the model's chat template where it has one, else a plain one.

A message keeps every field a template may render: ``role``, ``content``, ``name``,
``tool_calls`` (each call's ``function.arguments`` parsed into an object, which is what chat
templates expect; OpenAI clients send a JSON string), ``tool_call_id`` and
``reasoning_content``. Any other field is an error naming it: nothing a client sent is dropped
unseen.

Tools go to the template as ``tools``. A template that renders no tools (its source never
names ``tools`` or ``tool_calls``, as SmolLM2's) gets them the way most tool-trained chat
models saw them (:func:`tools_as_text`): the definitions in the system turn inside
``<tools></tools>``, each earlier call as ``<tool_call>{"name": ..., "arguments": ...}
</tool_call>`` in its assistant turn, and each tool result as a user turn inside
``<tool_response></tool_response>`` that names the tool and the call's id.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

ROLES = ("system", "user", "assistant", "tool", "developer")
FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")
"""The fields a message may carry."""

Message = Mapping[str, Any]
Conversation = Sequence[Message]

TOOLS_PREAMBLE = (
    "You can call functions to help answer the user. Their signatures, one JSON object per "
    "line, are inside <tools></tools>:"
)
TOOLS_INSTRUCTION = (
    "To call one, write a JSON object with the function's name and arguments inside "
    '<tool_call></tool_call>:\n<tool_call>\n{"name": <function name>, "arguments": '
    "<arguments object>}\n</tool_call>"
)


def render_chat(
    messages: Conversation,
    hf_tokenizer: Any,
    *,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The prompt for ``messages``, ending where the assistant's reply starts (with
    ``add_generation_prompt``).

    Uses ``chat_template`` (a Jinja template) or else the tokenizer's own, called with
    ``tools`` and ``chat_template_kwargs`` as transformers' ``apply_chat_template`` takes them
    (tools as text first for a template that renders none: see the module's docstring); a
    tokenizer without one gets one ``<|role|>`` header line per message, then
    ``<|assistant|>``.

    Raises:
        ValueError: no messages, an unknown role or field, content that is not text, or a
            malformed tool call (each naming where).
    """
    plain = [_message(i, m) for i, m in enumerate(messages)]
    if not plain:
        raise ValueError("messages must not be empty")
    template = chat_template or getattr(hf_tokenizer, "chat_template", None)
    tool_list = [dict(t) for t in tools] if tools else None
    uses_tools = bool(tool_list) or any(_uses_tools(m) for m in plain)
    if uses_tools and not (template and renders_tools(template)):
        plain, tool_list = tools_as_text(plain, tool_list), None
    if template:
        kwargs = dict(chat_template_kwargs or {})
        own = inspect.signature(hf_tokenizer.apply_chat_template).parameters
        taken = sorted(k for k in kwargs if k in own and own[k].kind != own[k].VAR_KEYWORD)
        if taken:  # an argument of the renderer, not a variable of the template
            raise ValueError(
                f"chat_template_kwargs.{taken[0]} is not a template variable: guidedec sets "
                "the renderer's own arguments"
            )
        try:
            text = hf_tokenizer.apply_chat_template(
                plain,
                chat_template=template,
                tools=tool_list,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except jinja2.TemplateError as exc:  # a template's syntax, or its raise_exception
            raise ValueError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc
        return str(text)
    lines = [f"<|{m['role']}|>\n{m['content']}\n" for m in plain]
    return "".join(lines) + ("<|assistant|>\n" if add_generation_prompt else "")


def load_chat_template(value: str) -> str:
    """A chat template given as vLLM's ``--chat-template`` takes it: a file's path, or the
    template itself (text holding ``{{`` or ``{%``).

    Raises:
        ValueError: neither a file nor a template.
    """
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"chat template {value!r}: no such file, and not a Jinja template")


def renders_tools(template: str) -> bool:
    """Whether a chat template renders tools and calls itself (its source names both)."""
    return "tools" in template and "tool_calls" in template


def tools_as_text(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` with the tools, the calls and the tool results written into the text, for a
    template that renders none of them (see the module's docstring)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if message.get("tool_calls"):
            calls = [_call_text(call) for call in message["tool_calls"]]
            content = "\n".join([content, *calls] if content else calls)
            message = {k: v for k, v in message.items() if k != "tool_calls"}
        if role == "tool":
            result = {"name": message.get("name"), "tool_call_id": message.get("tool_call_id")}
            header = json.dumps({k: v for k, v in result.items() if v is not None})
            content = f"<tool_response>\n{header}\n{content}\n</tool_response>"
            message = {"role": "user"}
        out.append({**message, "content": content})
    if tools:
        lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        text = f"{TOOLS_PREAMBLE}\n<tools>\n{lines}\n</tools>\n\n{TOOLS_INSTRUCTION}"
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def as_conversations(messages: Conversation | Sequence[Conversation]) -> list[Conversation]:
    """One conversation (a list of messages) or a list of them, as a list of conversations.

    Raises:
        ValueError: neither shape.
    """
    items = list(messages)
    if items and all(isinstance(item, Mapping) for item in items):
        return [items]  # type: ignore[list-item]
    if items and all(isinstance(item, Sequence) and not isinstance(item, str) for item in items):
        return [list(item) for item in items]  # type: ignore[arg-type]
    raise ValueError("messages must be a list of messages, or a list of such lists")


def _uses_tools(message: Mapping[str, Any]) -> bool:
    return message["role"] == "tool" or bool(message.get("tool_calls"))


def _call_text(call: Mapping[str, Any]) -> str:
    function = call["function"]
    body = {"name": function["name"], "arguments": function["arguments"]}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def _message(index: int, message: Message) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise ValueError(f"{where} must be an object with a role and a content")
    unknown = [key for key in message if key not in FIELDS]
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a message field guidedec can render")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}.role must be one of {list(ROLES)}, got {role!r}")
    out: dict[str, Any] = {"role": str(role), "content": _text(where, message.get("content"))}
    for key in ("name", "tool_call_id", "reasoning_content"):
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ValueError(f"{where}.{key} must be a string")
            out[key] = value
    calls = message.get("tool_calls")
    if calls:
        if role != "assistant":
            raise ValueError(f"{where}.tool_calls: only an assistant message makes tool calls")
        if not isinstance(calls, list):
            raise ValueError(f"{where}.tool_calls must be a list")
        out["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(calls)]
    return out


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    """A call as templates take it: ``{"id", "type": "function", "function": {"name",
    "arguments": <object>}}``."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"{where} must be {{'type': 'function', 'function': {{'name': ...}}}}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}.function.arguments is not JSON: {exc}") from exc
    if not isinstance(arguments, Mapping):
        raise ValueError(f"{where}.function.arguments must be a JSON object")
    out: dict[str, Any] = {
        "type": "function",
        "function": {"name": function["name"], "arguments": dict(arguments)},
    }
    if call.get("id") is not None:
        out["id"] = str(call["id"])
    return out


def _text(where: str, content: Any) -> str:
    """Message content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(_is_text_part(p) for p in content):
        return "".join(str(p["text"]) for p in content)
    raise ValueError(f"{where}.content must be text or a list of text parts")


def _is_text_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "text" and "text" in part
