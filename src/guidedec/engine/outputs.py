"""A request's output as the engine's step grows it: tokens appended, each finish decided in
one place (a stop token, a stop string, ``max_tokens``, the model's context, a value that breaks
its schema), and the final :class:`RequestOutput` (text, thought, where closing forced its end).
"""

from __future__ import annotations

from collections.abc import Sequence

from guidedec.engine.reasoning import ReasoningParser, content_ids, thinking_token
from guidedec.engine.request import Request, RequestOutput
from guidedec.engine.stats import EngineStats
from guidedec.engine.stop_strings import stop_string_start
from guidedec.engine.validation import OutputValidator
from guidedec.tokenizer import TokenizerInfo


class Outputs:
    """Appends sampled tokens to requests and finishes them.

    Args:
        tokenizer: The model's tokenizer (its stop tokens; decoding for the checks).
        max_model_len: The model's context.
        reasoning: The reasoning model's parser, or None.
        validator: Checks a complete guided output against its JSON schema.
        stats: The engine's counters (generated tokens, invalid outputs).
    """

    def __init__(
        self,
        tokenizer: TokenizerInfo,
        max_model_len: int,
        reasoning: ReasoningParser | None,
        validator: OutputValidator,
        stats: EngineStats,
    ) -> None:
        self.tokenizer, self.max_model_len, self.reasoning = tokenizer, max_model_len, reasoning
        self.validator, self.stats = validator, stats

    def append(self, req: Request, tokens: Sequence[int]) -> None:
        """Add sampled tokens, finishing at a stop token (the tokenizer's or the request's
        ``stop_token_ids``), ``max_tokens`` or the end of the model's context."""
        stops = (*self.tokenizer.stop_token_ids, *(req.params.stop_token_ids or ()))
        for token in tokens:
            if req.thinking:
                assert self.reasoning is not None
                token = thinking_token(self.reasoning, req, token, stops)
            if token in stops:
                self.finish_complete(req)
                return
            req.output_token_ids.append(token)
            self.stats.generated_tokens += 1
            if req.params.stop and not req.thinking and self._stopped_by_string(req):
                return
            if req.broken is not None:  # a settled value breaks the schema: no way back
                self.stats.invalid_outputs += 1
                req.finish("grammar_error", f"request {req.request_id}: {req.broken}")
                return
            full = len(req.all_token_ids) >= self.max_model_len
            if len(req.output_token_ids) >= req.params.max_tokens or full:
                req.finish("length")
                return

    def finish_complete(self, req: Request) -> None:
        """Finish at a stop token: ``stop``, or ``length`` when budget-aware closing forced
        its end (the output is complete; ``closed_from`` says where the forcing began),
        unless the output breaks its JSON schema (a schema its backend only approximates),
        which ends ``grammar_error`` naming where."""
        guide = req.params.guided_decoding
        if guide is not None:
            text = self.tokenizer.decode(content_ids(self.reasoning, req))
            problem = self.validator.problem(guide, text)
            if problem is not None:
                self.stats.invalid_outputs += 1
                req.finish("grammar_error", f"request {req.request_id}: {problem}")
                return
        if req.forced_from is not None:
            req.closed = True
            req.finish("length")
            return
        req.finish("stop")

    def _stopped_by_string(self, req: Request) -> bool:
        """Finish ``stop`` where the output first contains one of its ``stop`` strings."""
        stops = req.params.stop
        assert isinstance(stops, tuple)
        content = content_ids(self.reasoning, req)
        if not content:
            return False
        end = stop_string_start(self.tokenizer, content, stops)
        if end is None:
            return False
        req.text_end = end
        if req.params.guided_decoding is not None:
            req.incomplete = (
                "a stop string ended the guided output; the text before it was not checked "
                "against the guide"
            )
        req.finish("stop")
        return True

    def incomplete_note(self, request: Request) -> str:
        """Why a guided output ended ``length`` with its guide not complete."""
        left = f"{request.params.max_tokens} tokens (max_tokens)"
        if len(request.all_token_ids) >= self.max_model_len:
            left = f"the model's context of {self.max_model_len} tokens"
        if request.thinking:
            return f"the output is incomplete: it reached {left} while thinking, before its guide"
        if not request.params.close_within_budget:
            return f"the output is incomplete: it reached {left} with closing off"
        return (
            f"the output is incomplete: no completion of its guide fitted in what was left of "
            f"{left}"
        )

    def output(self, request: Request) -> RequestOutput:
        """The request's output: its text, its thought apart where the model thinks or the
        guide thinks first, and where closing forced its end."""
        if self.reasoning is None:
            content, reasoning = request.output_token_ids, None
        else:
            thinking, content = self.reasoning.split(
                request.output_token_ids, request.reasoning_end, request.thought
            )
            reasoning = None if thinking is None else self.tokenizer.decode(thinking)
        closed_from = None
        if request.closed and request.forced_from is not None:
            # The forced tokens are the content's last ones (closing acts after thinking).
            unforced = len(content) - (len(request.output_token_ids) - request.forced_from)
            closed_from = len(self.tokenizer.decode(content[: max(unforced, 0)]))
        text = self.tokenizer.decode(content)
        guide = request.params.guided_decoding
        opener = None if guide is None else guide.answer_opener
        if opener is not None and reasoning is None:  # think_first: the thought, the value
            at = text.find(opener)
            if at > 0:
                reasoning, text = text[:at], text[at:]
                closed_from = None if closed_from is None else max(0, closed_from - at)
        return request.output(text, reasoning, closed_from)
