"""SlotCache: one KV cache for every sequence slot, in a tensor per layer, for batched forwards.

Each layer holds ``keys`` and ``values`` of shape ``[num_slots, num_kv_heads, capacity,
head_dim]``: slot ``s`` keeps the key of its token at position ``p`` in ``keys[s, :, p]``. A
forward over tokens of several slots writes each token's key and value at its own
``(slot, position)`` (:meth:`SlotCache.update`, called by the model's attention layers) and
returns the whole storage; :mod:`guidedec.engine.slot_attention` then reads, for each group of
sequences, the slots and the key range it needs, and masks by position. So a slot never sees
another slot's keys, nor its own past its query's position: what lies beyond a slot's recorded
length (cropped drafts, an earlier sequence of the slot) is never read, and the next forward
overwrites it.

Why this layout rather than transformers' ``PagedAttentionCache``: that cache belongs to
transformers' own continuous-batching manager (its scheduler, its memory sizing, its request
states), and its ``sdpa`` path attends every token over the keys of the whole batch with a
block-diagonal mask, which costs batch-squared work. A dense tensor per layer with slot
indirection is what a batched static cache needs for CUDA graphs anyway (fixed addresses,
index tensors as graph inputs), gives exact per-slot attention, and keeps every slot's keys in
one place for export and import. The price is memory: every slot holds ``capacity`` positions.
``capacity`` grows geometrically up to ``max_len`` when a forward needs more (eager use), or is
``max_len`` from the start (``grow=False``, for graph capture, where addresses must not change).

The storage is made of ordinary tensors (not inference tensors), and forwards run under
``torch.no_grad()``: so the logits they return may be masked in place by the guided decoder.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers.cache_utils import CacheLayerMixin

INITIAL_CAPACITY = 256
"""Positions per slot allocated first when the cache grows on demand."""


class SlotLayer(CacheLayerMixin):
    """One layer's storage: ``keys`` and ``values``, each
    ``[num_slots, kv_heads, capacity, head_dim]``."""

    keys: torch.Tensor
    values: torch.Tensor
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.keys, self.values = keys, values
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise ValueError("a SlotLayer is allocated by its SlotCache")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError("a SlotLayer is written through SlotCache.update")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return int(self.keys.shape[2]), 0

    def get_seq_length(self) -> int:
        return 0  # per slot: the runner records lengths

    def get_max_length(self) -> int:
        return int(self.keys.shape[2])


class SlotCache(transformers.Cache):
    """Keys and values of ``num_slots`` sequences, written at explicit ``(slot, position)`` pairs.

    Args:
        config: The model's config (its text config gives the layer count and KV shape).
        num_slots: Slots in the storage (rows of dimension 0).
        max_len: The most positions a slot may hold.
        dtype: Storage dtype (the model's).
        device: Storage device (the model's).
        grow: True: start at ``min(INITIAL_CAPACITY, max_len)`` positions and grow on demand
            (:meth:`reserve`); False: allocate ``max_len`` now and never move the storage.
    """

    def __init__(
        self,
        config: Any,
        *,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        grow: bool = True,
    ) -> None:
        text = config.get_text_config(decoder=True)
        self.num_slots, self.max_len, self.grow = num_slots, max_len, grow
        self._shape = (
            num_slots,
            text.num_key_value_heads,
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        )
        self._dtype, self._device = dtype, device
        capacity = min(INITIAL_CAPACITY, max_len) if grow else max_len
        self.slot_layers = [self._new_layer(capacity) for _ in range(text.num_hidden_layers)]
        super().__init__(layers=list(self.slot_layers))
        self.write_slots = torch.zeros(0, dtype=torch.long, device=device)
        self.write_positions = torch.zeros(0, dtype=torch.long, device=device)

    @property
    def capacity(self) -> int:
        """Positions each slot can hold now."""
        return int(self.slot_layers[0].keys.shape[2])

    def reserve(self, length: int) -> None:
        """Make room for ``length`` positions per slot (at most ``max_len``), keeping what is
        stored. A growing cache at least doubles; a fixed one raises if ``length`` exceeds it."""
        if length <= self.capacity:
            return
        if not self.grow or length > self.max_len:
            raise ValueError(f"{length} positions exceed the cache's {self.capacity}")
        capacity, old = min(self.max_len, max(length, 2 * self.capacity)), self.capacity
        for layer in self.slot_layers:
            bigger = self._new_layer(capacity)
            bigger.keys[:, :, :old].copy_(layer.keys)
            bigger.values[:, :, :old].copy_(layer.values)
            layer.keys, layer.values = bigger.keys, bigger.values

    def set_writes(self, slots: torch.Tensor, positions: torch.Tensor) -> None:
        """Where the next forward's tokens go: token ``i`` of the packed input to
        ``(slots[i], positions[i])``. Both ``[num_tokens]`` int64 on the cache's device."""
        self.write_slots, self.write_positions = slots, positions

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the packed input's keys and values (``[1, kv_heads, num_tokens, head_dim]``) at
        the positions of :meth:`set_writes`; return the layer's whole storage."""
        layer = self.slot_layers[layer_idx]
        index = (self.write_slots, slice(None), self.write_positions)
        layer.keys[index] = key_states[0].transpose(0, 1)  # [num_tokens, kv_heads, head_dim]
        layer.values[index] = value_states[0].transpose(0, 1)
        return layer.keys, layer.values

    def export(self, slot: int, length: int) -> tuple[tuple[torch.Tensor, ...], ...]:
        """Copies of the slot's first ``length`` keys and values, per layer,
        ``[1, kv_heads, length, head_dim]``."""
        layers = self.slot_layers
        keys = tuple(layer.keys[slot : slot + 1, :, :length].clone() for layer in layers)
        values = tuple(layer.values[slot : slot + 1, :, :length].clone() for layer in layers)
        return keys, values

    def load(self, slot: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy per-layer ``(keys, values)`` ``[1, kv_heads, length, head_dim]`` into the slot."""
        length = data[0][0].shape[-2] if data else 0
        self.reserve(length)
        for layer, (keys, values) in zip(self.slot_layers, data, strict=True):
            target = layer.keys[slot : slot + 1, :, :length]
            if keys.shape != target.shape:
                raise ValueError(
                    f"KV state tensor {tuple(keys.shape)} does not fit the cache layer "
                    f"{tuple(layer.keys.shape)}"
                )
            target.copy_(keys)
            layer.values[slot : slot + 1, :, :length].copy_(values)

    def _new_layer(self, capacity: int) -> SlotLayer:
        slots, heads, head_dim = self._shape
        shape = (slots, heads, capacity, head_dim)
        keys = torch.zeros(shape, dtype=self._dtype, device=self._device)
        values = torch.zeros(shape, dtype=self._dtype, device=self._device)
        return SlotLayer(keys, values)
