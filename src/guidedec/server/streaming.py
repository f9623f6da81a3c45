"""Streamed answers (``"stream": true``): server-sent events of completion and chat chunks, in
OpenAI's shapes, each choice's text, reasoning and tool calls as deltas, the usage last when the
request asks for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi.responses import StreamingResponse

from guidedec.engine import LLM, RequestOutput
from guidedec.server.async_engine import AsyncEngine
from guidedec.server.choices import Choice, merged
from guidedec.server.metrics import ServerMetrics
from guidedec.server.protocol import ChatCompletionRequest, CompletionRequest, error_body
from guidedec.server.reasoning_stream import ReasoningStream
from guidedec.server.responses import Shape, chat_logprobs, completion_logprobs, guidedec_fields
from guidedec.server.stream import TextStream
from guidedec.server.tool_calls import ToolCalls
from guidedec.server.tool_stream import ToolCallStream


class Streams:
    """The chunks of the streamed answers of ``llm``, run by ``engine``; each output is counted
    in ``metrics`` as it ends."""

    def __init__(self, llm: LLM, engine: AsyncEngine, metrics: ServerMetrics) -> None:
        self.llm, self.engine, self.metrics = llm, engine, metrics

    async def completion(
        self,
        choices: Sequence[Choice],
        shape: Shape,
        echoes: Sequence[str],
        prompt_tokens: int,
        body: CompletionRequest,
    ) -> AsyncIterator[dict[str, Any]]:
        texts = {c.index: TextStream(self.llm.tokenizer, c.params.stop) for c in choices}
        if body.echo:
            for c in choices:
                yield shape.chunk(completion_choice(c.index, echoes[c.prompt_index], None))
        outputs: list[RequestOutput] = []
        async for choice, delta in merged(self.engine, choices):
            output = delta.output
            final = None if output is None else output.text
            piece = texts[choice.index].push(delta.token_ids, final_text=final)
            reason = None if output is None else output.finish_reason
            if not (piece or reason):
                continue
            row = completion_choice(choice.index, piece, reason)
            if body.logprobs is not None and delta.logprobs:
                row["logprobs"] = completion_logprobs(delta.logprobs, self.llm.tokenizer)
            yield shape.chunk(self._ended(row, output, outputs))
        if shape.include_usage:
            yield shape.usage_chunk(outputs, prompt_tokens)

    async def chat(
        self,
        choices: Sequence[Choice],
        shape: Shape,
        calls: ToolCalls | None,
        prompt_tokens: int,
        body: ChatCompletionRequest,
        thought: bool,
    ) -> AsyncIterator[dict[str, Any]]:
        """``thought``: the prompt opened the thinking (the output starts inside it)."""
        for c in choices:
            yield shape.chunk(chat_choice(c.index, {"role": "assistant", "content": ""}, None))
        texts = {
            c.index: ReasoningStream(
                self.llm.reasoning, self.llm.tokenizer, thought=thought, stop=c.params.stop
            )
            for c in choices
        }
        streams = {c.index: ToolCallStream(calls) for c in choices} if calls else {}
        outputs: list[RequestOutput] = []
        async for choice, delta in merged(self.engine, choices):
            output = delta.output
            stream = texts[choice.index]
            thinking, piece = stream.push(delta.token_ids, output)
            reason: str | None = None if output is None else output.finish_reason
            message: dict[str, Any] = {"reasoning_content": thinking} if thinking else {}
            if calls:
                tools = streams[choice.index]
                text, tool_calls = tools.deltas(stream.content.sent, final=reason is not None)
                message |= {"content": text} if text else {}
                message |= {"tool_calls": tool_calls} if tool_calls else {}
                reason = reason and calls.finish_reason(reason, tools.num_calls)
            elif piece:
                message["content"] = piece
            if not (message or reason):
                continue
            row = chat_choice(choice.index, message, reason)
            if body.logprobs and delta.logprobs:
                row["logprobs"] = chat_logprobs(delta.logprobs, self.llm.tokenizer)
            yield shape.chunk(self._ended(row, output, outputs))
        if shape.include_usage:
            yield shape.usage_chunk(outputs, prompt_tokens)

    def _ended(
        self, row: dict[str, Any], output: RequestOutput | None, outputs: list[RequestOutput]
    ) -> dict[str, Any]:
        """A chunk's choice, with the guidedec fields of the output it ends, if any."""
        if output is not None:
            row.update(guidedec_fields(output))
            outputs.append(output)
            self.metrics.record(output)
        return row


def completion_choice(index: int, text: str, reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}


def chat_choice(index: int, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}


def sse(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    """``chunks`` as server-sent events, ``[DONE]`` last; a request the engine refuses after
    the stream began ends it with an error object."""

    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
        except ValueError as exc:
            yield f"data: {json.dumps(error_body(str(exc)))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
