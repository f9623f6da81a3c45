"""Log-probabilities of the generated tokens, for requests that ask for them (``logprobs``).

They come from the distribution each token was drawn from: the row's logits after the guide's
mask (a token the guide forbids has none) and the request's temperature (1 for greedy), before
top-k and top-p. Under a guide that is what the output was sampled from, not what the model
alone would have said; a row the guide or budget-aware closing narrows to one token gives that
token log-probability 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_LOGPROB = -9999.0
"""What a log-probability of minus infinity is reported as (JSON has no infinity), as vLLM."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and its row's most likely tokens, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(
    row: torch.Tensor,
    token: int,
    *,
    temperature: float,
    num_top: int,
    allowed: torch.Tensor | None = None,
) -> TokenLogprob:
    """``token``'s entry in the log-softmax of ``row`` (masked logits over the vocabulary, or the
    logits of the ``allowed`` token ids alone), at ``temperature``, with the ``num_top``
    likeliest tokens."""
    scale = temperature if temperature > 0 else 1.0
    values = row if allowed is None else row[allowed]
    logp = torch.log_softmax(values.double() / scale, dim=-1)
    if allowed is None:
        chosen = float(logp[token])
    else:
        where = (allowed == token).nonzero()
        chosen = float(logp[where[0, 0]]) if where.numel() else float("-inf")
    top: tuple[tuple[int, float], ...] = ()
    if num_top:
        best, index = logp.topk(min(num_top, logp.numel()))
        ids = index if allowed is None else allowed[index]
        top = tuple(
            (int(i), _finite(float(v)))
            for i, v in zip(ids.tolist(), best.tolist(), strict=True)
            if v != float("-inf")
        )
    return TokenLogprob(token, _finite(chosen), top)


def _finite(value: float) -> float:
    return max(value, MIN_LOGPROB)
