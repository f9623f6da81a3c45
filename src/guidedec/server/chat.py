"""Chat messages to a prompt: the model's chat template where it has one, else a plain one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "developer")


def render_chat(messages: Sequence[Mapping[str, Any]], hf_tokenizer: Any) -> str:
    """The prompt for ``messages`` ending where the assistant's reply starts.

    Uses the tokenizer's chat template when it has one; otherwise one ``<|role|>`` header line per
    message, then ``<|assistant|>``.

    Raises:
        ValueError: no messages, an unknown role, or content that is not text.
    """
    plain = [_plain_message(i, m) for i, m in enumerate(messages)]
    if not plain:
        raise ValueError("messages must not be empty")
    if getattr(hf_tokenizer, "chat_template", None):
        text = hf_tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
        return str(text)
    lines = [f"<|{m['role']}|>\n{m['content']}\n" for m in plain]
    return "".join(lines) + "<|assistant|>\n"


def _plain_message(index: int, message: Mapping[str, Any]) -> dict[str, str]:
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
