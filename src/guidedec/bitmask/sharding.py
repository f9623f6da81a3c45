"""Tensor parallelism: apply a full-vocabulary bitmask to logits sharded over the vocabulary.

With tensor parallelism over ``T`` ranks, rank ``r`` may hold only the columns
``[r * V / T, (r + 1) * V / T)`` of the logits, where ``V`` is the padded vocabulary (or, for an
EAGLE-3 draft model, the length of its ``d2t`` table). As in TensorRT-LLM's guided decoder,
``T = V // logits_columns`` is inferred from the logits width and the rank's shard is
``tp_rank = rank % T``.

Every rank holds the full ``[B, W]`` bitmask. Without ``d2t`` a shard starts on a word boundary
(``V / T`` must be a multiple of 32) and the rank applies its own slice of words. With ``d2t``
column ``j`` of the shard is draft token ``g = shard_start + j``, which stands for target token
``g + d2t[g]``: a full-vocabulary coordinate that may fall in any rank's range. The rank therefore
looks it up in the full bitmask row, through the local table ``d2t[shard] + shard_start``.
(TensorRT-LLM passes the word slice there, which reads the wrong bits whenever ``T > 1``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from guidedec.bitmask.apply import Backend, apply_bitmask, check_d2t
from guidedec.bitmask.layout import BITS_PER_WORD


@dataclass(frozen=True, slots=True)
class VocabShard:
    """One rank's part of the vocabulary and of each bitmask row.

    Attributes:
        tp_size: ``T``, the number of shards (1: the logits are not sharded).
        tp_rank: This rank's shard, in ``[0, T)``.
        vocab_size: ``V``, the columns of the unsharded logits.
        column_start, column_stop: The logits columns of the shard, ``[r * V / T, (r+1) * V / T)``.
        word_start, word_stop: The bitmask words this rank reads: its own words without ``d2t``,
            every word with ``d2t`` (targets can be anywhere in the vocabulary).
    """

    tp_size: int
    tp_rank: int
    vocab_size: int
    column_start: int
    column_stop: int
    word_start: int
    word_stop: int

    @property
    def columns(self) -> slice:
        return slice(self.column_start, self.column_stop)

    @property
    def words(self) -> slice:
        return slice(self.word_start, self.word_stop)


def vocab_shard(
    logits_columns: int, vocab_size: int, bitmask_size: int, rank: int, *, has_d2t: bool
) -> VocabShard:
    """The shard of logits ``logits_columns`` wide, on global rank ``rank``.

    Args:
        logits_columns: Width of this rank's logits.
        vocab_size: ``V``: the padded vocabulary the bitmask covers, or with ``d2t`` the length of
            the (full, unsharded) ``d2t`` table.
        bitmask_size: ``W``, the words of one bitmask row.
        rank: The global rank; the shard is ``rank % T``.
        has_d2t: Whether columns are mapped to target tokens by a ``d2t`` table.

    Logits at least ``V`` wide are not sharded (``T = 1``, the whole bitmask, whatever ``W``).

    Raises:
        ValueError: for a non-positive size, a negative rank, a logits width that does not
            divide ``V``, and without ``d2t`` when ``W`` is not ``T`` equal word slices of
            ``V / T`` tokens each (``W % T != 0``, ``V / T`` not a multiple of 32, or
            ``W != V / 32``).
    """
    if logits_columns <= 0 or vocab_size <= 0 or bitmask_size <= 0 or rank < 0:
        raise ValueError(
            f"logits_columns={logits_columns}, vocab_size={vocab_size} and bitmask_size="
            f"{bitmask_size} must be positive and rank={rank} non-negative"
        )
    if logits_columns >= vocab_size:
        return VocabShard(1, 0, vocab_size, 0, logits_columns, 0, bitmask_size)
    if vocab_size % logits_columns != 0:
        raise ValueError(
            f"logits have {logits_columns} columns, which does not divide the vocabulary of "
            f"{vocab_size} tokens: vocab-sharded logits must hold V / tp_size columns per rank"
        )
    tp_size = vocab_size // logits_columns
    tp_rank = rank % tp_size
    start = tp_rank * logits_columns
    if has_d2t:
        words = (0, bitmask_size)
    else:
        _check_word_aligned(logits_columns, vocab_size, bitmask_size, tp_size)
        words = (start // BITS_PER_WORD, (start + logits_columns) // BITS_PER_WORD)
    return VocabShard(tp_size, tp_rank, vocab_size, start, start + logits_columns, *words)


def _check_word_aligned(
    shard_columns: int, vocab_size: int, bitmask_size: int, tp_size: int
) -> None:
    """Each rank's tokens must be exactly its ``W / T`` words, so that it can slice them."""
    if bitmask_size % tp_size != 0:
        raise ValueError(
            f"bitmask_size={bitmask_size} words is not divisible by tp_size={tp_size} "
            f"(vocabulary {vocab_size} / logits width {shard_columns}); pad the vocabulary to "
            f"a multiple of {BITS_PER_WORD * tp_size} tokens"
        )
    if shard_columns % BITS_PER_WORD != 0:
        raise ValueError(
            f"each of the tp_size={tp_size} shards of the {vocab_size}-token vocabulary has "
            f"{shard_columns} tokens, not a multiple of {BITS_PER_WORD}, so shards do not start "
            f"on bitmask word boundaries; pad the vocabulary to a multiple of "
            f"{BITS_PER_WORD * tp_size} tokens"
        )
    if bitmask_size * BITS_PER_WORD != vocab_size:
        raise ValueError(
            f"bitmask_size={bitmask_size} words does not cover the {vocab_size}-token "
            f"vocabulary exactly ({vocab_size // BITS_PER_WORD} words); allocate the bitmask "
            "for the padded vocabulary"
        )


def apply_bitmask_sharded(
    logits_shard: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    token_mask: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    rank: int = 0,
    vocab_size_padded: int | None = None,
    backend: Backend = "auto",
) -> None:
    """:func:`~guidedec.bitmask.apply_bitmask` on this rank's shard of vocab-sharded logits.

    The result on ``logits_shard`` is bit for bit the columns of the shard after applying the
    full bitmask to the unsharded logits.

    Args:
        logits_shard: ``[B, V / T]`` (or ``[V / T]``): this rank's columns; modified in place.
        bitmask: ``[B, W]`` (or ``[W]``): the full bitmask rows, covering the whole vocabulary.
        token_mask: As for ``apply_bitmask``.
        d2t: Optional full ``[V_draft]`` draft-to-target table (not this rank's slice): draft
            token ``g`` is target token ``g + d2t[g]``. ``V = V_draft`` then.
        rank: The global rank; its shard is ``rank % T``.
        vocab_size_padded: ``V`` without ``d2t``: the padded vocabulary of the unsharded logits
            (default: the logits width, i.e. unsharded). Ignored with ``d2t``.
        backend: As for ``apply_bitmask``.

    Raises:
        ValueError: as :func:`vocab_shard` and ``apply_bitmask`` do.
    """
    if not _has_columns(logits_shard) or not _has_columns(bitmask):
        # Nothing to shard: apply_bitmask rejects the shapes or has nothing to mask.
        apply_bitmask(logits_shard, bitmask, token_mask=token_mask, d2t=d2t, backend=backend)
        return
    columns = logits_shard.shape[-1]
    vocab_size = _sharded_vocab_size(columns, d2t, vocab_size_padded)
    shard = vocab_shard(columns, vocab_size, bitmask.shape[-1], rank, has_d2t=d2t is not None)
    if shard.tp_size == 1:
        apply_bitmask(logits_shard, bitmask, token_mask=token_mask, d2t=d2t, backend=backend)
        return
    local_d2t = None
    if d2t is not None:
        check_d2t(d2t)  # its shape is the full table's: the shard's slice is checked by apply
        # Column j is draft token g = start + j, target g + d2t[g] = j + (d2t[g] + start). int64:
        # the shift must not overflow a narrow d2t dtype.
        local_d2t = d2t[shard.columns].to(torch.int64) + shard.column_start
    words = bitmask[..., shard.words]
    apply_bitmask(logits_shard, words, token_mask=token_mask, d2t=local_d2t, backend=backend)


def _has_columns(tensor: torch.Tensor) -> bool:
    return tensor.dim() in (1, 2) and tensor.shape[-1] > 0


def _sharded_vocab_size(
    columns: int, d2t: torch.Tensor | None, vocab_size_padded: int | None
) -> int:
    """``V``; a d2t that is not 1-D counts as unsharded, for ``apply_bitmask`` to reject it."""
    if d2t is not None:
        return int(d2t.shape[0]) if d2t.dim() == 1 else columns
    return columns if vocab_size_padded is None else vocab_size_padded
