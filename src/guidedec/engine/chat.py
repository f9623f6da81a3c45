"""Chat messages to a prompt, one rendering for ``LLM.chat``, the CLI's chat mode and the server:
the model's chat template where it has one, else a plain one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "developer")

Message = Mapping[str, Any]
Conversation = Sequence[Message]


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
    ``tools`` and ``chat_template_kwargs`` as transformers' ``apply_chat_template`` takes them;
    a tokenizer without one gets one ``<|role|>`` header line per message, then
    ``<|assistant|>``.

    Raises:
        ValueError: no messages, an unknown role, content that is not text, or ``tools`` for
            a model without a chat template.
    """
    plain = [_plain_message(i, m) for i, m in enumerate(messages)]
    if not plain:
        raise ValueError("messages must not be empty")
    template = chat_template or getattr(hf_tokenizer, "chat_template", None)
    if template:
        text = hf_tokenizer.apply_chat_template(
            plain,
            chat_template=template,
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **dict(chat_template_kwargs or {}),
        )
        return str(text)
    if tools:
        raise ValueError("tools need a chat template: the model has none, and none was given")
    lines = [f"<|{m['role']}|>\n{m['content']}\n" for m in plain]
    return "".join(lines) + ("<|assistant|>\n" if add_generation_prompt else "")


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


def _plain_message(index: int, message: Message) -> dict[str, str]:
    if not isinstance(message, Mapping):
        raise ValueError(f"messages[{index}] must be an object with a role and a content")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"messages[{index}].role must be one of {list(ROLES)}, got {role!r}")
    return {"role": str(role), "content": _text(index, message.get("content"))}


def _text(index: int, content: Any) -> str:
    """Message content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(_is_text_part(p) for p in content):
        return "".join(str(p["text"]) for p in content)
    raise ValueError(f"messages[{index}].content must be text or a list of text parts")


def _is_text_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "text" and "text" in part
