"""OpenAI request bodies (the fields guidedec reads) and the error object it answers with.

Fields are OpenAI's and vLLM's, with vLLM's names and defaults. A field that changes the output
and that guidedec does not implement (:data:`UNSUPPORTED`) is refused with HTTP 400 naming it,
unless it carries its default; other unknown fields (``user``, ``metadata``...) are ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_N = 16
"""The most choices one request may ask for (``n``)."""
MAX_LOGPROBS = 20
"""The most alternatives per token ``top_logprobs`` (chat) or ``logprobs`` (completions) takes."""

UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    # field: the values that mean "not used", accepted as such
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "best_of": (1,),
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "ignore_eos": (False,),
    "bad_words": ([],),
    "allowed_token_ids": (),
    "prompt_logprobs": (),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (),
    "suffix": ("",),
    "guided_decoding_backend": (),
    "guided_whitespace_pattern": (),
    "functions": (),
    "function_call": (),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "documents": (),
    "mm_processor_kwargs": (),
    "priority": (0,),
}
"""Fields other servers take that guidedec does not implement: a request that sets one to
anything but null or a value listed here gets HTTP 400 naming it, never an output that quietly
ignores it."""


_SGLANG = ("json_schema", "regex", "ebnf")  # SGLang's guide fields


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    continuous_usage_stats: bool = Field(default=False, le=False)


class _Request(BaseModel):
    """Fields shared by both endpoints. Known fields of the wrong type are refused, and so are
    the :data:`UNSUPPORTED` ones set to a value guidedec would ignore."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # -1: off, as in vLLM
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    # Guides at the top level: vLLM's older fields and SGLang's (see server.structured).
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    json_schema: dict[str, Any] | str | None = None
    regex: str | None = None
    ebnf: str | None = None
    thinking_token_budget: int | None = Field(default=None, ge=0)
    close_within_budget: bool = True  # guidedec: end guided outputs complete within max_tokens

    def problem(self) -> tuple[str, str] | None:
        """``(field, message)`` for the first field set in a way guidedec refuses."""
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value is not None and value not in UNSUPPORTED[name]:
                return name, f"{name} is not supported by guidedec (got {value!r})"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return None

    def top_level_guides(self) -> dict[str, Any]:
        """The guide fields outside ``structured_outputs`` that the request sets."""
        names = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", *_SGLANG)
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)


class ChatMessage(BaseModel):
    """A chat message. Fields beyond these reach the renderer, which names them in its error
    (:func:`guidedec.engine.chat.render_chat`): none is dropped unseen."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def problem(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs to be true"
        return super().problem()


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize``: a ``prompt``, or chat ``messages`` rendered by the chat template."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


def error_body(
    message: str, *, param: str | None = None, kind: str = "invalid_request_error", code: int = 400
) -> dict[str, Any]:
    """The OpenAI error object (with vLLM's numeric ``code``)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
