"""BatchedModelRunner: one forward of the model for every input of an engine step.

The inputs' tokens are packed into one row (:class:`PackedBatch`): the dense layers and the
``lm_head`` run once, over exactly the tokens and logits rows the step needs, which is what
makes throughput grow with the batch (the ``lm_head`` weights are read once per step instead of
once per sequence). Attention keeps each sequence to its own slot of a
:class:`~guidedec.engine.slot_cache.SlotCache` (:mod:`guidedec.engine.slot_attention`).

The logits match :class:`~guidedec.engine.runner.ModelRunner`'s (a batch-1 forward per
sequence) up to floating-point summation order: matrix products over a batch may reduce in
another order, and attention reduces over the group's key range with the masked keys weighing
exactly 0. In float64 greedy tokens agree; the tests measure the float32 difference.

``static=True`` allocates the cache at its full length up front and adds a scratch slot
(:attr:`BatchedModelRunner.scratch_slot`) that padding rows of a captured graph write to, so
that :meth:`BatchedModelRunner.forward_packed` can be captured with its inputs in static
tensors (:mod:`guidedec.engine.graphs`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from guidedec.engine.model import LoadedModel
from guidedec.engine.runner import ForwardInput, SlotRunner, cache_kwarg_name
from guidedec.engine.slot_attention import AttentionGroup, attention_group, slot_attention
from guidedec.engine.slot_cache import SlotCache


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """The tensors of one batched forward, all on the model's device.

    Attributes:
        token_ids: ``[1, N]`` int64, every input's new tokens, input after input.
        positions: ``[1, N]`` int64, each token's position in its sequence.
        slots: ``[N]`` int64, each token's slot (where its key and value are written).
        logits_index: ``[R]`` int64, the packed positions whose logits are returned, in order.
        groups: The attention groups, covering every token once.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logits_index: torch.Tensor
    groups: tuple[AttentionGroup, ...]


def _with_zero_rows(logits: torch.Tensor, inputs: Sequence[ForwardInput]) -> torch.Tensor:
    """The ``[sum(num_logits), vocab]`` logits from the rows computed, zeros where the inputs
    asked for none (``no_logits``)."""
    kept, row = [], 0
    for item in inputs:
        kept += [row + j for j in range(item.num_logits) if j not in item.no_logits]
        row += item.num_logits
    full = logits.new_zeros(row, logits.shape[-1])
    full[torch.tensor(kept, dtype=torch.long, device=logits.device)] = logits
    return full


def _sparse_rows(inputs: Sequence[ForwardInput]) -> dict[int, tuple[int, ...]]:
    """The rows of the returned logits (rows asked for, ``no_logits`` left out) whose
    ``sparse_logits`` columns are all the caller reads, with those columns."""
    sparse: dict[int, tuple[int, ...]] = {}
    kept = 0
    for item in inputs:
        columns = dict(item.sparse_logits)
        for j in range(item.num_logits):
            if j in item.no_logits:
                continue
            if j in columns:
                sparse[kept] = columns[j]
            kept += 1
    return sparse


@contextmanager
def _sparse_head(head: torch.nn.Linear, sparse: dict[int, tuple[int, ...]]) -> Iterator[None]:
    """While in effect, ``head`` (the model's ``lm_head``, a linear layer) computes the rows of
    ``sparse`` at their columns alone, zeros elsewhere: a row of the ``lm_head`` costs
    ``hidden * vocab`` multiply-adds, a handful of columns next to nothing."""
    weight, bias = head.weight, head.bias

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])
        out = rows.new_zeros(rows.shape[0], weight.shape[0])
        dense = [r for r in range(rows.shape[0]) if r not in sparse]
        if dense:
            index = torch.tensor(dense, dtype=torch.long, device=rows.device)
            out[index] = torch.nn.functional.linear(rows[index], weight, bias)
        for row, columns in sparse.items():
            ids = torch.tensor(columns, dtype=torch.long, device=rows.device)
            part_bias = None if bias is None else bias[ids]
            out[row, ids] = torch.nn.functional.linear(rows[row], weight[ids], part_bias)
        return out.reshape(*hidden.shape[:-1], weight.shape[0])

    head.forward = forward  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        del head.forward


def pack_inputs(
    inputs: Sequence[ForwardInput],
    starts: Sequence[int],
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> PackedBatch:
    """Pack ``inputs`` whose slots hold ``starts[i]`` tokens each; one attention group per
    distinct query length."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    keep: list[int] = []
    by_length: dict[int, list[int]] = {}
    offset = 0
    for i, (item, start) in enumerate(zip(inputs, starts, strict=True)):
        n = len(item.token_ids)
        ids += item.token_ids
        positions += range(start, start + n)
        slots += [item.slot] * n
        row0 = offset + n - item.num_logits
        keep += [row0 + j for j in range(item.num_logits) if j not in item.no_logits]
        by_length.setdefault(n, []).append(i)
        offset += n
    offsets = [0]
    for item in inputs:
        offsets.append(offsets[-1] + len(item.token_ids))

    def tensor(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    groups = []
    for n, members in by_length.items():
        first = tensor([offsets[i] for i in members]).unsqueeze(1)
        token_index = first + torch.arange(n, device=device)
        group_starts = tensor([starts[i] for i in members]).unsqueeze(1)
        key_length = max(starts[i] for i in members) + n
        groups.append(
            attention_group(
                tensor([inputs[i].slot for i in members]),
                token_index,
                group_starts + torch.arange(n, device=device),
                key_length,
                dtype,
            )
        )
    return PackedBatch(
        tensor(ids).unsqueeze(0),
        tensor(positions).unsqueeze(0),
        tensor(slots),
        tensor(keep),
        tuple(groups),
    )


class BatchedModelRunner(SlotRunner):
    """:class:`~guidedec.engine.runner.SlotRunner`'s interface and errors, one forward per call.

    Args:
        model: The model; every layer must use full attention (no sliding window).
        max_num_seqs: Number of slots (at least 1).
        max_cache_len: Positions per slot (default and at most ``model.max_model_len``).
        static: Allocate ``max_num_seqs + 1`` slots (one scratch slot) of ``max_cache_len``
            positions up front, never moved: for CUDA-graph capture. Otherwise the cache starts
            small and grows geometrically to what the sequences need.

    Raises:
        ValueError: ``max_num_seqs`` or ``max_cache_len`` out of range, or a model with
            sliding-window or non-attention layers.
    """

    def __init__(
        self,
        model: LoadedModel,
        *,
        max_num_seqs: int,
        max_cache_len: int | None = None,
        static: bool = False,
    ) -> None:
        length = model.max_model_len if max_cache_len is None else max_cache_len
        if not 1 <= length <= model.max_model_len:
            raise ValueError(
                f"max_cache_len must be in [1, max_model_len={model.max_model_len}], got {length}"
            )
        name = "max_model_len" if length == model.max_model_len else "max_cache_len"
        super().__init__(model, max_num_seqs=max_num_seqs, max_len=length, max_len_name=name)
        _check_full_attention(model.model)
        self.static = static
        self.scratch_slot = max_num_seqs  # a row of the storage no sequence owns (static only)
        self.cache = SlotCache(
            model.model.config,
            num_slots=max_num_seqs + 1 if static else max_num_seqs,
            max_len=length,
            dtype=model.dtype,
            device=model.device,
            grow=not static,
        )
        self._cache_kwarg = cache_kwarg_name(model.model)
        self._num_layers = len(self.cache.layers)

    def forward_packed(self, batch: PackedBatch) -> torch.Tensor:
        """One forward of a packed batch, without any check or host bookkeeping: the logits of
        ``batch.logits_index``, ``[R, vocab_size]``. The caller reserved the cache and records
        the new lengths (:meth:`advance`). Reads no device value on the host, so
        :mod:`guidedec.engine.graphs` can capture it."""
        self.cache.set_writes(batch.slots, batch.positions[0])
        kwargs: dict[str, Any] = {self._cache_kwarg: self.cache}
        with torch.no_grad(), slot_attention(self.model.model):
            out = self.model.model(
                input_ids=batch.token_ids,
                position_ids=batch.positions,
                use_cache=True,
                logits_to_keep=batch.logits_index,
                slot_groups=batch.groups,
                **kwargs,
            )
        logits: torch.Tensor = out.logits[0]
        return logits

    def advance(self, slot: int, num_tokens: int) -> None:
        """Record ``num_tokens`` more cached tokens in ``slot``, after :meth:`forward_packed`
        (or a replay of it) fed them."""
        self._lengths[slot] += num_tokens

    def _run(self, inputs: Sequence[ForwardInput]) -> torch.Tensor:
        starts = [self._lengths[item.slot] for item in inputs]
        self.cache.reserve(max(s + len(i.token_ids) for s, i in zip(starts, inputs, strict=True)))
        batch = pack_inputs(inputs, starts, device=self.model.device, dtype=self.model.dtype)
        sparse = _sparse_rows(inputs)
        head = getattr(self.model.model, "lm_head", None)
        if sparse and isinstance(head, torch.nn.Linear):
            with _sparse_head(head, sparse):
                logits = self.forward_packed(batch)
        else:
            logits = self.forward_packed(batch)
        for item in inputs:
            self.advance(item.slot, len(item.token_ids))
        if any(item.no_logits for item in inputs):
            return _with_zero_rows(logits, inputs)
        return logits

    def _crop(self, slot: int, length: int) -> None:
        pass  # positions past the length are never read, then overwritten

    def _free(self, slot: int) -> None:
        pass  # the storage stays for the slot's next sequence

    def _export(
        self, slot: int, length: int
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        keys, values = self.cache.export(slot, length)
        return keys, values

    def _import(self, slot: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.cache.load(slot, data)


def _check_full_attention(model: Any) -> None:
    text = model.config.get_text_config(decoder=True)
    layer_types = set(getattr(text, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(text, "sliding_window", None):
        raise ValueError(
            f"the batched runner needs full-attention layers only; this model has "
            f"{sorted(layer_types)} layers (sliding_window={getattr(text, 'sliding_window', None)})"
        )
