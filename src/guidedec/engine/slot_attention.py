"""Attention over a :class:`~guidedec.engine.slot_cache.SlotCache` for a packed batch of tokens.

A batched forward packs the new tokens of every scheduled sequence into one row (``[1, N]``):
decode tokens, verification chunks and prefill chunks side by side, so the model's dense layers
and its ``lm_head`` run once over exactly the tokens there are, with no padding. Only attention
must keep the sequences apart. :func:`slot_attention_forward`, registered with transformers as
the ``"guidedec_slots"`` attention implementation, does it per :class:`AttentionGroup`: the
sequences of one query length, whose queries it gathers into ``[G, heads, T, head_dim]``,
whose keys it reads from their slots of the cache (``[G, kv_heads, L, head_dim]``, the first
``L`` positions) and which it attends through transformers' ``sdpa`` attention with an
additive mask: key position ``j`` is visible to the query at position ``p`` iff ``j <= p``.
A step has few groups (decodes, verifications of ``1 + k`` tokens, a prefill chunk or two).

The model keeps its own attention implementation: :func:`slot_attention` switches it to
``"guidedec_slots"`` for the duration of one forward only. transformers builds no mask for an
implementation without a mask function, so none is built.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SLOT_ATTENTION = "guidedec_slots"


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    """Sequences of one query length ``T``, attended together.

    Attributes:
        slots: ``[G]`` int64, each sequence's slot (row of the cache storage).
        token_index: ``[G, T]`` int64, where each sequence's tokens lie in the packed input.
        mask: ``[G, 1, T, key_length]`` additive mask in the model's dtype: 0 where the query
            at that position may see the key, -inf elsewhere.
        key_length: Key positions read per slot: one past the group's last query position.
    """

    slots: torch.Tensor
    token_index: torch.Tensor
    mask: torch.Tensor
    key_length: int


def attention_group(
    slots: torch.Tensor,
    token_index: torch.Tensor,
    positions: torch.Tensor,
    key_length: int,
    dtype: torch.dtype,
) -> AttentionGroup:
    """The group of ``slots`` whose queries sit at ``positions`` (``[G, T]``, on the device);
    the mask is computed on the device, so this may run inside a CUDA-graph capture."""
    keys = torch.arange(key_length, device=positions.device)
    visible = keys <= positions.unsqueeze(-1)  # [G, T, L]
    mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
    mask.masked_fill_(~visible, -math.inf)
    return AttentionGroup(slots, token_index, mask.unsqueeze(1), key_length)


def slot_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    slot_groups: Sequence[AttentionGroup] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention over packed tokens: ``query`` ``[1, heads, N, head_dim]``;
    ``key``/``value`` the layer's whole slot storage (what ``SlotCache.update`` returns).
    Returns ``[1, N, heads, head_dim]``, each token attended within its own sequence only."""
    if slot_groups is None:
        raise ValueError(
            f"the {SLOT_ATTENTION!r} attention needs slot_groups (a SlotCache forward)"
        )
    heads, head_dim = query.shape[1], query.shape[3]
    out = query.new_empty(query.shape[2], heads, head_dim)
    for group in slot_groups:
        q = query[0][:, group.token_index].transpose(0, 1)  # [G, heads, T, head_dim]
        k = key[:, :, : group.key_length].index_select(0, group.slots)
        v = value[:, :, : group.key_length].index_select(0, group.slots)
        o, _ = sdpa_attention_forward(module, q, k, v, group.mask, **kwargs)  # [G, T, heads, hd]
        out[group.token_index.flatten()] = o.reshape(-1, heads, head_dim)
    return out.unsqueeze(0), None


AttentionInterface.register(SLOT_ATTENTION, slot_attention_forward)


@contextmanager
def slot_attention(model: Any) -> Iterator[None]:
    """Run ``model`` with :func:`slot_attention_forward` inside the block, then restore its own
    attention implementation (also if the block raises)."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = SLOT_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous
