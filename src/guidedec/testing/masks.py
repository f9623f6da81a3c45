"""Token bitmasks for tests and benchmarks: packing, unpacking and random rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from guidedec.bitmask.layout import BITMASK_DTYPE, BITS_PER_WORD, bitmask_size

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
