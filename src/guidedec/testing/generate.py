"""Random-logits guided generation: a model stand-in for soundness checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from guidedec.decoder import GuidedDecoder, GuidedRequest
from guidedec.grammar import GuidedDecodingParams


@dataclass(slots=True)
class GeneratedOutput:
    """One request's output from :func:`random_guided_generate`."""

    token_ids: list[int]
    finished: bool  # a stop token was sampled (the guide was complete)
    error: str | None = None


def sample_from_logits(
    logits: torch.Tensor, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """One token per row from ``softmax(logits / temperature)`` by inverse-CDF sampling;
    -inf logits are never drawn. Much faster than ``torch.multinomial`` over 100k tokens."""
    probs = torch.softmax(logits / temperature, dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    target = torch.rand(logits.shape[0], 1, generator=generator) * cdf[:, -1:]
    index = torch.searchsorted(cdf, target, right=True).clamp_(max=logits.shape[1] - 1)
    # A draw that lands on a run of zero-probability columns at the end moves back to the
    # last column with mass; inside the row, searchsorted(right=True) skips zero-width bins.
    last_allowed = logits.shape[1] - 1 - torch.argmax((probs.flip(-1) > 0).int(), dim=-1)
    return torch.minimum(index.flatten(), last_allowed)


def random_guided_generate(
    decoder: GuidedDecoder,
    guides: Sequence[GuidedDecodingParams],
    *,
    seed: int = 0,
    max_tokens: int = 256,
    temperature: float = 1.0,
) -> list[GeneratedOutput]:
    """Generate one output per guide from seeded random logits, through ``decoder``.

    A stand-in for a model: each step draws fresh Gaussian logits for every live request, the
    decoder masks them, and a token is sampled from the softmax. Whatever the logits, every output
    that finishes (samples a stop token) must follow its guide: this is the soundness check.
    The stop token is not part of ``token_ids``.
    """
    if len(guides) > decoder.max_num_sequences:
        raise ValueError(f"{len(guides)} guides for {decoder.max_num_sequences} slots")
    generator = torch.Generator().manual_seed(seed)
    stop_ids = set(decoder.config.tokenizer.stop_token_ids)
    outputs = [GeneratedOutput([], False) for _ in guides]
    live = list(range(len(guides)))
    step_requests = [GuidedRequest.context(guides[i], request_id=i, seq_slot=i) for i in live]
    for _ in range(max_tokens):
        decoder.add_batch(step_requests)
        logits = torch.randn(len(live), decoder.vocab_size, generator=generator)
        failed = dict(decoder.execute(logits))
        sampled = sample_from_logits(logits, temperature, generator).tolist()
        still_live, step_requests = [], []
        for i, token in zip(live, sampled, strict=True):
            if i in failed:
                outputs[i].error = failed[i]
            elif token in stop_ids:
                outputs[i].finished = True
            else:
                outputs[i].token_ids.append(token)
                still_live.append(i)
                step_requests.append(
                    GuidedRequest.generation(guides[i], request_id=i, seq_slot=i, new_token=token)
                )
        live = still_live
        if not live:
            break
    return outputs
