"""StaticModelRunner: the model runner with a preallocated KV cache per slot, so that a decode
step reads and writes only tensors whose addresses never change, which a CUDA graph can capture.

Each slot owns a transformers ``StaticCache`` (batch 1) of ``max_cache_len`` positions, allocated
once. A forward writes its keys and values at the positions it is given and attends over the
whole buffer through an explicit attention mask: key position ``j`` is visible to a query at
position ``p`` iff ``j <= p``. So positions past the recorded length (cropped drafts, an earlier
sequence of the slot) are never read, and :meth:`crop` and :meth:`free` only change the recorded
length; the next forward overwrites what lies beyond it.

Nothing a forward does reads a device value on the host: the mask is computed on the device from
the position tensor, and each layer's write offset (``StaticLayer.cumulative_length``, a device
tensor) is copied from it, so :meth:`StaticModelRunner.forward_tensors` may run inside a CUDA
graph capture with its inputs in static tensors.

The logits match :class:`~guidedec.engine.runner.ModelRunner`'s closely but need not match bit
for bit: attention here reduces over ``max_cache_len`` keys (the masked ones weigh exactly 0)
rather than over the cached ones, which may change the order of floating-point sums.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from guidedec.engine.model import LoadedModel
from guidedec.engine.runner import ForwardInput, SlotRunner, cache_kwarg_name

SUPPORTED_ATTENTION = ("sdpa", "eager")  # take an additive 4-D mask as given


class StaticModelRunner(SlotRunner):
    """:class:`~guidedec.engine.runner.ModelRunner`'s interface and errors over static caches.

    Args:
        model: The model; every layer must use full attention (no sliding window) with the
            ``sdpa`` or ``eager`` attention implementation.
        max_num_seqs: Number of slots (at least 1).
        max_cache_len: Positions per slot (default and at most ``model.max_model_len``). Memory
            is ``max_num_seqs * max_cache_len`` positions of every layer's keys and values,
            allocated up front; a smaller value saves it and lowers the longest sequence.

    Raises:
        ValueError: ``max_num_seqs`` or ``max_cache_len`` below 1, or a model whose cache or
            attention cannot be driven with an explicit mask.
    """

    def __init__(
        self, model: LoadedModel, *, max_num_seqs: int, max_cache_len: int | None = None
    ) -> None:
        length = model.max_model_len if max_cache_len is None else max_cache_len
        if not 1 <= length <= model.max_model_len:
            raise ValueError(
                f"max_cache_len must be in [1, max_model_len={model.max_model_len}], got {length}"
            )
        name = "max_model_len" if length == model.max_model_len else "max_cache_len"
        super().__init__(model, max_num_seqs=max_num_seqs, max_len=length, max_len_name=name)
        _check_attention(model.model)
        self._cache_kwarg = cache_kwarg_name(model.model)
        self._caches = [self._new_cache() for _ in range(max_num_seqs)]
        self._num_layers = len(self._caches[0].layers)
        # Key positions 0 .. max_len - 1, compared with the query positions to build the mask.
        self._key_positions = torch.arange(length, device=model.device)

    def forward_tensors(
        self, slot: int, token_ids: torch.Tensor, positions: torch.Tensor, num_logits: int = 1
    ) -> torch.Tensor:
        """One forward of ``slot`` from device tensors, without any check or host bookkeeping.

        For :mod:`guidedec.engine.graphs`, which captures it: ``token_ids`` and ``positions``
        are ``[1, n]`` int64 tensors on the model's device (positions consecutive, the first
        one the slot's cached length), and the caller records the new length itself. Nothing
        here reads a device value on the host.

        Returns:
            The logits of the last ``num_logits`` positions, ``[num_logits, vocab_size]``.
        """
        cache = self._caches[slot]
        kwargs = {self._cache_kwarg: cache}
        with torch.inference_mode():
            for layer in cache.layers:
                layer.cumulative_length.copy_(positions[0, 0])  # where this forward writes
            visible = self._key_positions <= positions[0].unsqueeze(-1)  # [n, max_len]
            mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=visible.device)
            mask.masked_fill_(~visible, float("-inf"))
            out = self.model.model(
                input_ids=token_ids,
                position_ids=positions,
                attention_mask=mask[None, None],  # 4-D: transformers uses it as given
                use_cache=True,
                logits_to_keep=num_logits,
                **kwargs,
            )
        logits: torch.Tensor = out.logits[0, -num_logits:]
        return logits

    def advance(self, slot: int, num_tokens: int) -> None:
        """Record ``num_tokens`` more cached tokens in ``slot``, after :meth:`forward_tensors`
        (or a replay of it) fed them."""
        self._lengths[slot] += num_tokens

    def _run_one(self, item: ForwardInput) -> torch.Tensor:
        start = self._lengths[item.slot]
        device = self.model.device
        ids = torch.tensor([list(item.token_ids)], dtype=torch.long, device=device)
        positions = torch.arange(start, start + ids.shape[1], device=device).unsqueeze(0)
        logits = self.forward_tensors(item.slot, ids, positions, item.num_logits)
        self.advance(item.slot, ids.shape[1])
        return logits

    def _crop(self, slot: int, length: int) -> None:
        pass  # positions past the length are masked, then overwritten

    def _free(self, slot: int) -> None:
        pass  # the buffers stay allocated for the slot's next sequence

    def _export(
        self, slot: int, length: int
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        layers = self._caches[slot].layers
        keys = tuple(layer.keys[:, :, :length].clone() for layer in layers)
        values = tuple(layer.values[:, :, :length].clone() for layer in layers)
        return keys, values

    def _import(self, slot: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        with torch.inference_mode():
            for layer, (keys, values) in zip(self._caches[slot].layers, data, strict=True):
                if keys.shape != layer.keys[:, :, : keys.shape[-2]].shape:
                    raise ValueError(
                        f"KV state tensor {tuple(keys.shape)} does not fit the cache layer "
                        f"{tuple(layer.keys.shape)}"
                    )
                layer.keys[:, :, : keys.shape[-2]].copy_(keys)
                layer.values[:, :, : values.shape[-2]].copy_(values)

    def _new_cache(self) -> Any:
        config = self.model.model.config
        text = config.get_text_config(decoder=True)
        with torch.inference_mode():
            cache = transformers.StaticCache(config=config, max_cache_len=self.max_len)
            kinds = {type(layer).__name__ for layer in cache.layers}
            if kinds != {"StaticLayer"}:
                raise ValueError(
                    f"the static runner needs full-attention layers only; this model's cache "
                    f"has {sorted(kinds)}"
                )
            head_dim = getattr(text, "head_dim", None) or (
                text.hidden_size // text.num_attention_heads
            )
            cache.early_initialization(
                batch_size=1,
                num_heads=text.num_key_value_heads,
                head_dim=head_dim,
                dtype=self.model.dtype,
                device=self.model.device,
            )
        return cache


def _check_attention(model: Any) -> None:
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"the static runner drives attention with an explicit mask, which needs one of "
            f"{SUPPORTED_ATTENTION}; this model uses {implementation!r}"
        )
