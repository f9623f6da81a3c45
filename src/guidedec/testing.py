"""Helpers for tests and benchmarks, shipped with the package so that users can reuse them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from guidedec.bitmask.layout import BITMASK_DTYPE, BITS_PER_WORD, bitmask_size
from guidedec.decoder import GuidedDecoder, GuidedRequest
from guidedec.grammar import GrammarMatcher, GrammarMatcherFactory, GuidedDecodingParams
from guidedec.tokenizer import TokenizerInfo

# ---------------------------------------------------------------------------------------------
# Token bitmasks: packing, unpacking and random rows
# ---------------------------------------------------------------------------------------------

_UINT32_SPAN = 1 << BITS_PER_WORD
_INT32_LIMIT = 1 << (BITS_PER_WORD - 1)


def _bit_weights(device: torch.device) -> torch.Tensor:
    """``[1, 2, 4, ..., 2**31]`` as int64, the value of each bit of a word (LSB first)."""
    return torch.ones(BITS_PER_WORD, dtype=torch.int64, device=device) << torch.arange(
        BITS_PER_WORD, dtype=torch.int64, device=device
    )


def bool_mask_to_bitmask(allowed: torch.Tensor, *, padding_allowed: bool = False) -> torch.Tensor:
    """Pack a boolean mask into an int32 token bitmask.

    Args:
        allowed: ``[B, V]`` or ``[V]`` bool; ``True`` means the token is allowed.
        padding_allowed: value given to the padding bits past ``V`` in the last word of a row.

    Returns:
        ``[B, ceil(V / 32)]`` (or ``[ceil(V / 32)]``) int32 on the same device: token ``t`` is
        bit ``t % 32`` (least significant bit first) of word ``t // 32``, set iff allowed.
    """
    if allowed.dtype != torch.bool or allowed.dim() not in (1, 2):
        raise ValueError(
            f"allowed must be a 1-D or 2-D bool tensor, got {allowed.dtype} {tuple(allowed.shape)}"
        )
    rows = allowed.reshape(-1, allowed.shape[-1])
    num_rows, vocab_size = rows.shape
    num_words = bitmask_size(vocab_size)
    padded = torch.full(
        (num_rows, num_words * BITS_PER_WORD), padding_allowed, device=allowed.device
    )
    padded[:, :vocab_size] = rows
    bits = padded.view(num_rows, num_words, BITS_PER_WORD).to(torch.int64)
    unsigned = (bits * _bit_weights(allowed.device)).sum(dim=-1)
    # Reinterpret each unsigned 32-bit word as two's-complement int32.
    signed = torch.where(unsigned >= _INT32_LIMIT, unsigned - _UINT32_SPAN, unsigned)
    words = signed.to(BITMASK_DTYPE)
    return words if allowed.dim() == 2 else words[0]


def bitmask_to_bool_mask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack the first ``vocab_size`` bits of each bitmask row into a boolean mask.

    Args:
        bitmask: ``[B, W]`` or ``[W]`` int32 with ``32 * W >= vocab_size``.
        vocab_size: number of tokens to unpack; padding bits past it are dropped.

    Returns:
        ``[B, vocab_size]`` (or ``[vocab_size]``) bool, ``True`` where the token's bit is set.
    """
    if bitmask.dtype != BITMASK_DTYPE or bitmask.dim() not in (1, 2):
        raise ValueError(
            f"bitmask must be a 1-D or 2-D int32 tensor, got {bitmask.dtype} {tuple(bitmask.shape)}"
        )
    if vocab_size > bitmask.shape[-1] * BITS_PER_WORD:
        raise ValueError(
            f"vocab_size {vocab_size} exceeds the {bitmask.shape[-1]} words of the bitmask"
        )
    shifts = torch.arange(BITS_PER_WORD, dtype=BITMASK_DTYPE, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size] != 0


def random_bool_mask(
    rows: int,
    vocab_size: int,
    *,
    density: float,
    generator: torch.Generator | None = None,
    block_size: int = 1,
) -> torch.Tensor:
    """``[rows, vocab_size]`` bool on the CPU with a fraction ``density`` of allowed tokens.

    Tokens come in aligned blocks of ``block_size`` consecutive ids (``[k * block_size,
    (k + 1) * block_size)``), each block allowed independently with probability ``density``.
    ``block_size=1`` scatters the allowed tokens; larger blocks give whole allowed or forbidden
    bytes and words, as a grammar allowing ranges of token ids does.
    """
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must lie in [0, 1], got {density}")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_blocks = -(-vocab_size // block_size)
    blocks = torch.rand(rows, num_blocks, generator=generator) < density
    return blocks.repeat_interleave(block_size, dim=1)[:, :vocab_size]


def random_bitmask(
    rows: int,
    vocab_size: int,
    *,
    density: float,
    generator: torch.Generator | None = None,
    block_size: int = 1,
    padding_allowed: bool = False,
) -> torch.Tensor:
    """``[rows, ceil(vocab_size / 32)]`` int32 bitmask drawn by :func:`random_bool_mask`.

    ``density=0.01`` mimics a structural position of a JSON grammar, ``density=0.99`` a position
    inside a string; 0 and 1 give all-forbidden and all-allowed rows. ``padding_allowed`` sets
    the padding bits past ``vocab_size``.
    """
    allowed = random_bool_mask(
        rows, vocab_size, density=density, generator=generator, block_size=block_size
    )
    return bool_mask_to_bitmask(allowed, padding_allowed=padding_allowed)


def mixed_density_bitmask(
    rows: int,
    vocab_size: int,
    *,
    densities: Sequence[float] = (0.0, 0.01, 0.5, 0.99, 1.0),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A bitmask whose row ``i`` is drawn with density ``densities[i % len(densities)]``."""
    if not densities:
        raise ValueError("densities must not be empty")
    parts = [
        random_bool_mask(1, vocab_size, density=densities[i % len(densities)], generator=generator)
        for i in range(rows)
    ]
    allowed = torch.cat(parts) if parts else torch.zeros(0, vocab_size, dtype=torch.bool)
    return bool_mask_to_bitmask(allowed)


# ---------------------------------------------------------------------------------------------
# Driving matchers: feeding tokens, reading masks, checking whole outputs
# ---------------------------------------------------------------------------------------------


def feed_tokens(matcher: GrammarMatcher, tokens: Sequence[int]) -> int:
    """Accept ``tokens`` one by one; returns how many were accepted before the first rejection."""
    for i, token in enumerate(tokens):
        if not matcher.accept_token(token):
            return i
    return len(tokens)


def next_token_mask(matcher: GrammarMatcher, vocab_size: int) -> torch.Tensor:
    """The matcher's next-token bitmask as a fresh ``[ceil(V / 32)]`` int32 row."""
    bitmask = torch.zeros(1, bitmask_size(vocab_size), dtype=BITMASK_DTYPE)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0]


def allowed_token_ids(row: torch.Tensor, vocab_size: int) -> set[int]:
    """The token ids a bitmask row allows (padding bits ignored)."""
    allowed = bitmask_to_bool_mask(row.unsqueeze(0), vocab_size)[0]
    return set(torch.nonzero(allowed).flatten().tolist())


def accepts_output(
    factory: GrammarMatcherFactory,
    tokenizer: TokenizerInfo,
    params: GuidedDecodingParams,
    text: str,
) -> bool:
    """Whether ``text`` (tokenised as the model would) is a complete output of the guide: every
    token is accepted, then a stop token. Raises ``GrammarError`` if the guide does not compile."""
    matcher = factory.create(params)
    tokens = tokenizer.encode(text)
    if feed_tokens(matcher, tokens) != len(tokens):
        return False
    return matcher.accept_token(tokenizer.eos_token_id)


# --- Random-logits guided generation ---------------------------------------------------------


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
