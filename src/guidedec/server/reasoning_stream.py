"""A reasoning model's stream parted as vLLM parts it: ``delta.reasoning_content`` while the
model thinks, ``delta.content`` after ``</think>`` (see :mod:`guidedec.engine.reasoning`)."""

from __future__ import annotations

from collections.abc import Sequence

from guidedec.engine import RequestOutput
from guidedec.engine.reasoning import ReasoningParser
from guidedec.server.stream import TextStream
from guidedec.tokenizer import TokenizerInfo


class ReasoningStream:
    """Routes a request's new tokens to its reasoning or its content text stream."""

    def __init__(
        self,
        parser: ReasoningParser | None,
        tokenizer: TokenizerInfo,
        *,
        thought: bool,
        stop: Sequence[str] | None,
    ) -> None:
        self.parser = parser
        self.thinking = parser is not None and thought
        self.reasoning = TextStream(tokenizer)
        self.content = TextStream(tokenizer, stop)
        self._first = True
        self._undecided = False  # qwen3 without an opening <think>: reasoning only if it ends

    def push(self, token_ids: Sequence[int], output: RequestOutput | None) -> tuple[str, str]:
        """``(new reasoning text, new content text)``; ``output`` at the request's end."""
        thinking_ids, content_ids = [], []
        for token in token_ids:
            first, self._first = self._first, False
            if not self.thinking or self.parser is None:
                content_ids.append(token)
            elif first and token == self.parser.start_id:
                continue
            elif token == self.parser.end_id:
                self.thinking = self._undecided = False
            else:
                self._undecided |= first and self.parser.name == "qwen3"
                thinking_ids.append(token)
        if output is not None:
            reasoning = self.reasoning.push(thinking_ids, final_text=output.reasoning or "")
            return reasoning, self.content.push(content_ids, final_text=output.text)
        if self._undecided:  # held back: content after all if no </think> comes
            self.reasoning.token_ids.extend(thinking_ids)
            return "", ""
        return self.reasoning.push(thinking_ids), self.content.push(content_ids)
