"""Tool calls streamed as they are generated: OpenAI's ``delta.tool_calls`` chunks, each with
its ``index``, the call's ``id``, ``type`` and ``function.name`` first, then its
``function.arguments`` piece by piece, and the text around the calls as ``delta.content``.

The text so far is read by the request's format (:class:`guidedec.server.tool_calls.ToolCalls`),
so a call's name is sent once its string is closed, and its arguments as far as they have come
(``pythonic`` calls: once the call has ended, as JSON).
"""

from __future__ import annotations

import uuid
from typing import Any

from guidedec.server.tool_calls import ToolCalls


class ToolCallStream:
    """Turns the growing text of a tools request's output into ``content`` and ``tool_calls``
    deltas. Text that may start a call (a trigger's beginning) and trailing whitespace wait
    for what follows; whitespace left beside calls at the end is not sent."""

    def __init__(self, calls: ToolCalls) -> None:
        self.calls = calls
        self._content = 0  # content characters sent
        self._sent: list[int] = []  # argument characters sent, per call
        self._ids: list[str] = []

    @property
    def num_calls(self) -> int:
        return len(self._sent)

    def deltas(self, text: str, *, final: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """The content piece and the ``tool_calls`` entries that ``text`` (the whole output so
        far) adds."""
        pieces = self.calls.scan(text)
        content = "".join(p.text for p in pieces if not p.call)
        if not final:
            parser = self.calls.parser
            if pieces and not pieces[-1].call and parser is not None:
                after_call = len(pieces) > 1 and pieces[-2].call
                tail = pieces[-1].text if after_call else content
                content = content[: len(content) - parser.hold_back(tail, after_call=after_call)]
            content = content.rstrip()
        elif any(p.call for p in pieces) and not content[self._content :].strip():
            content = content[: self._content]
        piece = content[self._content :]
        self._content = max(self._content, len(content))
        out: list[dict[str, Any]] = []
        for index, call in enumerate(p for p in pieces if p.call and p.name is not None):
            if index == len(self._sent):
                self._sent.append(0)
                self._ids.append(f"call_{uuid.uuid4().hex[:24]}")
                head = {"index": index, "id": self._ids[index], "type": "function"}
                out.append({**head, "function": {"name": call.name, "arguments": ""}})
            more = call.arguments[self._sent[index] :]
            if more:
                self._sent[index] = len(call.arguments)
                out.append({"index": index, "function": {"arguments": more}})
        return piece, out
