"""Prompts as the engine takes them: text or token ids, checked and tokenised once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from guidedec.engine.sampling import SamplingParams
from guidedec.tokenizer import TokenizerInfo

Prompt = str | Sequence[int]


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    text: str | None  # None when the prompt came as token ids
    token_ids: list[int]


def tokenize_prompts(
    prompts: Prompt | Sequence[Prompt],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    tokenizer: TokenizerInfo,
    max_model_len: int,
) -> list[tuple[TokenizedPrompt, SamplingParams]]:
    """Pair each prompt with its sampling params (one for all, or one each), checking every
    prompt before any is queued.

    Raises:
        ValueError: the counts differ, or a prompt is empty, of the wrong type, or too long for
            the model (naming the prompt's index).
    """
    items = as_prompt_list(prompts)
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        params = [sampling_params or SamplingParams()] * len(items)
    else:
        params = list(sampling_params)
    if len(params) != len(items):
        raise ValueError(f"{len(items)} prompts but {len(params)} sampling params")
    tokenized = [tokenize(p, tokenizer) for p in items]
    for i, prompt in enumerate(tokenized):
        check_prompt(f"prompt {i}", prompt, tokenizer.vocab_size, max_model_len)
    return list(zip(tokenized, params, strict=True))


def tokenize(prompt: Prompt, tokenizer: TokenizerInfo) -> TokenizedPrompt:
    """The prompt's tokens. Raises ``ValueError`` for text that is not valid Unicode (a lone
    surrogate, which no tokenizer can encode)."""
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"the prompt holds a lone surrogate ({prompt[exc.start]!r} at character "
                f"{exc.start}), which is not valid Unicode text"
            ) from None
        return TokenizedPrompt(prompt, tokenizer.encode(prompt))
    return TokenizedPrompt(None, [int(t) for t in prompt])


def check_prompt(name: str, prompt: TokenizedPrompt, vocab_size: int, max_model_len: int) -> None:
    """Raise ``ValueError`` naming ``name`` if the prompt is empty, has token ids outside the
    vocabulary, or leaves no room to generate."""
    if not prompt.token_ids:
        raise ValueError(f"{name} is empty")
    if any(not 0 <= t < vocab_size for t in prompt.token_ids):
        raise ValueError(f"{name} has token ids outside the vocabulary [0, {vocab_size})")
    if len(prompt.token_ids) >= max_model_len:
        raise ValueError(
            f"{name} has {len(prompt.token_ids)} tokens; the model takes at most "
            f"{max_model_len} (prompt and output together)"
        )


def as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A prompt, a list of token ids, or a list of either, as a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    items: list[object] = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [[t for t in items if isinstance(t, int)]]  # one prompt as token ids
    result: list[Prompt] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            result.append(item)
        elif isinstance(item, Sequence) and all(isinstance(t, int) for t in item):
            result.append([int(t) for t in item])
        else:
            raise ValueError(f"prompt {i} must be a string or a list of token ids")
    return result
