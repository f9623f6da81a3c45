"""Reasoning models: the thinking is free, the guide starts after the end-of-thinking token.

With ``LLM(reasoning_parser="deepseek_r1" | "qwen3")`` a request starts out thinking, unless its
prompt already closed a ``<think>`` (a template with thinking off writes ``<think></think>``):
its tokens are unguided until the model emits ``</think>``. The step after, the request's
grammar matcher is created as at the end of a prompt, with everything it brings (masks,
jump-forward, budget-aware closing, the final schema check), and guides the content alone. While
thinking:

- a stop token sampled by a guided request becomes ``</think>`` (an answer is owed);
- ``SamplingParams.thinking_token_budget`` makes the token after that many thinking tokens
  ``</think>``;
- no drafts are proposed, so that no draft can carry unguided tokens past ``</think>``.

:meth:`ReasoningParser.split` parts an output into ``reasoning`` and content as vLLM's parsers
of the same names do: ``deepseek_r1`` takes an output with no ``</think>`` as all reasoning,
``qwen3`` as all content unless it opened with ``<think>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from guidedec.engine.request import Request
from guidedec.tokenizer import TokenizerInfo

ReasoningParserName = Literal["deepseek_r1", "qwen3"]
REASONING_PARSERS: tuple[ReasoningParserName, ...] = ("deepseek_r1", "qwen3")
START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    """The thinking markers of one tokenizer, and how an output parts around them."""

    name: ReasoningParserName
    start_id: int
    end_id: int

    @classmethod
    def create(cls, name: str, tokenizer: TokenizerInfo) -> ReasoningParser:
        """Raises ``ValueError`` for an unknown name or a tokenizer without single tokens for
        ``<think>`` and ``</think>``."""
        if name not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {REASONING_PARSERS}, got {name!r}")
        ids = []
        for marker in (START, END):
            encoded = tokenizer.hf_tokenizer.encode(marker, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(
                    f"reasoning_parser {name!r} needs {marker} as one token; this tokenizer "
                    f"encodes it as {encoded}"
                )
            ids.append(int(encoded[0]))
        return cls(name, ids[0], ids[1])

    def thinks_at_start(self, prompt_ids: Sequence[int]) -> bool:
        """Whether generation starts inside the thinking: unless the prompt's last marker is
        ``</think>``."""
        for token in reversed(prompt_ids):
            if token == self.end_id:
                return False
            if token == self.start_id:
                return True
        return True

    def split(
        self, token_ids: Sequence[int], end: int | None, thought: bool
    ) -> tuple[list[int] | None, list[int]]:
        """``(reasoning tokens or None, content tokens)`` of an output whose ``</think>`` is
        at ``end`` (None: none came); ``thought``: it started inside the thinking. The
        markers belong to neither part."""
        if not thought:
            return None, list(token_ids)
        if end is not None:
            return self._strip_start(token_ids[:end]), list(token_ids[end + 1 :])
        if self.name == "qwen3" and (not token_ids or token_ids[0] != self.start_id):
            return None, list(token_ids)
        return self._strip_start(token_ids), []

    def _strip_start(self, ids: Sequence[int]) -> list[int]:
        return list(ids[1:] if ids and ids[0] == self.start_id else ids)


def thinking_token(parser: ReasoningParser, req: Request, token: int, stops: Sequence[int]) -> int:
    """The token a thinking request takes in place of the sampled ``token``: ``</think>`` for
    a guided request's stop token or past its ``thinking_token_budget``; updates the request
    when its thinking ends (the next step starts its guide)."""
    guided = req.params.guided_decoding is not None
    budget = req.params.thinking_token_budget
    if (guided and token in stops) or (budget is not None and len(req.output_token_ids) >= budget):
        token = parser.end_id
    if token == parser.end_id:
        req.thinking, req.reasoning_end = False, len(req.output_token_ids)
        req.guide_starts = guided
    return token


def content_ids(parser: ReasoningParser | None, req: Request) -> list[int]:
    """The request's output tokens past its thinking (all of them without a parser)."""
    if parser is None:
        return req.output_token_ids
    return parser.split(req.output_token_ids, req.reasoning_end, req.thought)[1]
