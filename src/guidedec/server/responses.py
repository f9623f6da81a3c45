"""The response objects of one request: completions and chat completions, whole or as stream
chunks, with OpenAI's (and vLLM's) field names, one id and one creation time per request."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from guidedec.engine import RequestOutput
from guidedec.engine.logprobs import TokenLogprob
from guidedec.tokenizer import TokenizerInfo


class Shape:
    """Builds the response objects of one request."""

    def __init__(self, prefix: str, kind: str, model: str, *, include_usage: bool = False) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind, self.model, self.created = kind, model, int(time.time())
        self.include_usage = include_usage

    def wrap(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        """One stream chunk of one choice (``usage`` null in it when usage is to come last)."""
        kind = "chat.completion.chunk" if self.kind == "chat.completion" else self.kind
        body = self.wrap(kind, [choice])
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, outputs: Sequence[RequestOutput], prompt_tokens: int) -> dict[str, Any]:
        """The last chunk of a stream with ``stream_options.include_usage``: no choices."""
        kind = "chat.completion.chunk" if self.kind == "chat.completion" else self.kind
        return {**self.wrap(kind, []), "usage": usage(outputs, prompt_tokens)}


def guidedec_fields(output: RequestOutput) -> dict[str, Any]:
    """The choice's guidedec fields: ``error`` (a ``grammar_error``), ``incomplete`` (a guided
    output cut at its budget or by a stop string: why), ``closed_from`` (a guided output that
    budget-aware closing ended, complete, with ``finish_reason`` ``length``: the character of
    its text from which the budget chose the tokens)."""
    extra: dict[str, Any] = {} if output.error is None else {"error": output.error}
    if output.incomplete is not None:
        extra["incomplete"] = output.incomplete
    if output.closed_from is not None:
        extra["closed_from"] = output.closed_from
    return extra


def usage(outputs: Sequence[RequestOutput], prompt_tokens: int) -> dict[str, int]:
    """Usage of a request's choices (``prompt_tokens``: each prompt counted once, whatever
    ``n``)."""
    completion = sum(len(o.token_ids) for o in outputs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def completion_logprobs(
    entries: Sequence[TokenLogprob], tokenizer: TokenizerInfo, text_offset: int = 0
) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/v1/completions``: parallel lists, ``top_logprobs`` one
    ``{token: logprob}`` per position."""
    tokens, offsets, offset = [], [], text_offset
    for entry in entries:
        piece = tokenizer.decode([entry.token_id])
        tokens.append(piece)
        offsets.append(offset)
        offset += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [
            {tokenizer.decode([i]): lp for i, lp in e.top} if e.top else None for e in entries
        ],
        "text_offset": offsets,
    }


def chat_logprobs(entries: Sequence[TokenLogprob], tokenizer: TokenizerInfo) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/v1/chat/completions``: ``content``, one entry per token."""

    def token(i: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([i])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**token(e.token_id, e.logprob), "top_logprobs": [token(i, lp) for i, lp in e.top]}
            for e in entries
        ]
    }
