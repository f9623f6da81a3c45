"""Model runners: forward passes of a causal LM over sequence slots.

Positions are explicit: the tokens of a :class:`ForwardInput` take positions
``num_cached(slot) .. num_cached(slot) + len(token_ids) - 1``, and a sequence's logits do not
depend on what else is in the call (up to floating-point summation order), so a request that
joins mid-flight gets the logits it would get alone.

:class:`SlotRunner` holds what every runner shares (slot lengths, input and state checks, the
order of checks and effects). The engine's runner is
:class:`guidedec.engine.batched_runner.BatchedModelRunner`: one forward for all inputs of a
step. :class:`ModelRunner` runs each input as its own batch-1 forward with a growing
``DynamicCache`` per slot: the oracle the batched runner is tested against.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from guidedec.engine.model import LoadedModel


@dataclass(frozen=True, slots=True)
class ForwardInput:
    """Tokens to feed one slot, after everything already cached in it.

    Attributes:
        slot: The sequence slot, in ``[0, max_num_seqs)``.
        token_ids: The new tokens (at least one).
        num_logits: Return logits for the last ``num_logits`` of these positions, in
            ``[1, len(token_ids)]``: 1 for prefill or decode, ``k + 1`` to verify ``k`` drafts.
        no_logits: Rows of those (``0 <= j < num_logits``) whose logits the caller will not
            read (a row its guide narrows to one token); a runner may skip their ``lm_head``
            and return zeros there.
        sparse_logits: ``(row, token ids)`` pairs: rows whose logits the caller reads at those
            columns only (a row its guide narrows to a few tokens: the mask sets the others to
            -inf); a runner may compute those columns of the ``lm_head`` alone and return
            zeros in the others.
    """

    slot: int
    token_ids: Sequence[int]
    num_logits: int = 1
    no_logits: tuple[int, ...] = ()
    sparse_logits: tuple[tuple[int, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class KVState:
    """A self-contained copy of one slot's KV cache, to move a sequence to another runner.

    Attributes:
        keys: Per layer, the cached keys, ``[1, num_kv_heads, length, head_dim]``.
        values: Per layer, the cached values, same shape as ``keys``.
        length: Number of cached tokens.
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    length: int


class SlotRunner(ABC):
    """Sequence slots, their cached lengths and the checks every runner makes.

    Subclasses store the KV caches: they implement :meth:`_run`, :meth:`_crop`,
    :meth:`_free`, :meth:`_export` and :meth:`_import`, each called only after its arguments
    were checked here, so that every runner accepts and refuses exactly the same calls.

    Args:
        model: The model to run.
        max_num_seqs: Number of slots (at least 1).
        max_len: The most tokens one slot may hold.
        max_len_name: What ``max_len`` is called in error messages (``max_model_len``).
    """

    def __init__(
        self, model: LoadedModel, *, max_num_seqs: int, max_len: int, max_len_name: str
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.vocab_size = model.tokenizer.vocab_size
        self.max_len, self._max_len_name = max_len, max_len_name
        self._lengths = [0] * max_num_seqs
        self._num_layers = 0  # set by the subclass once it knows its cache layout

    def forward(self, inputs: Sequence[ForwardInput]) -> torch.Tensor:
        """Feed each input's tokens to its slot and return the requested logits.

        Returns:
            For each input in order, the logits of its last ``num_logits`` positions:
            shape ``[sum(num_logits), vocab_size]``, the model's dtype, on the model's device.
            Row ``j`` of an input's block (``0 <= j < num_logits``) scores the token that follows
            ``token_ids[len(token_ids) - num_logits + j]``. No inputs give a ``[0, vocab_size]``
            tensor.

        Raises:
            ValueError: A slot out of range or repeated, empty ``token_ids``, a token outside the
                vocabulary, ``num_logits`` outside ``[1, len(token_ids)]``, or a sequence that
                would exceed ``max_model_len``. Nothing is run when any input is invalid.
        """
        self.check_inputs(inputs)
        if not inputs:
            return torch.empty(0, self.vocab_size, dtype=self.model.dtype, device=self.model.device)
        return self._run(inputs)

    def check_inputs(self, inputs: Sequence[ForwardInput]) -> None:
        """Raise the ValueError :meth:`forward` would raise for ``inputs``; change nothing."""
        for item in inputs:
            self._check_input(item)
        slots = [item.slot for item in inputs]
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot appears more than once in one forward call: {slots}")

    def num_cached(self, slot: int) -> int:
        """Number of tokens in the slot's KV cache."""
        self._check_slot(slot)
        return self._lengths[slot]

    def crop(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` cached tokens of the slot (drop rejected drafts).

        Call it after a verify step, before feeding the slot again: the next tokens then take
        positions from ``length`` on. ``length`` must be in ``[0, num_cached(slot)]``.
        """
        cached = self.num_cached(slot)
        if not 0 <= length <= cached:
            raise ValueError(f"cannot crop slot {slot} to {length} tokens: it holds {cached}")
        if length < cached:
            self._crop(slot, length)
            self._lengths[slot] = length

    def free(self, slot: int) -> None:
        """Drop the slot's KV cache; the slot is then empty."""
        self._check_slot(slot)
        self._free(slot)
        self._lengths[slot] = 0

    def export_cache(self, slot: int) -> KVState:
        """A copy of the slot's KV cache that shares no memory with the runner."""
        length = self.num_cached(slot)
        if length == 0:
            return KVState(keys=(), values=(), length=0)
        keys, values = self._export(slot, length)
        return KVState(keys=keys, values=values, length=length)

    def import_cache(self, slot: int, state: KVState) -> None:
        """Replace the slot's cache with a copy of ``state`` (from :meth:`export_cache` of a
        runner of the same model and dtype); the slot then continues exactly as the exporting
        slot would have."""
        self._check_slot(slot)
        self._check_state(state)
        self.free(slot)
        if state.length == 0:
            return
        device = self.model.device
        data = [(k.to(device), v.to(device)) for k, v in zip(state.keys, state.values, strict=True)]
        self._import(slot, data)
        self._lengths[slot] = state.length

    # --- what a subclass stores ----------------------------------------------------------------

    @abstractmethod
    def _run(self, inputs: Sequence[ForwardInput]) -> torch.Tensor:
        """Feed checked, non-empty inputs; update ``_lengths``; return the logits as
        :meth:`forward` does."""

    @abstractmethod
    def _crop(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached tokens of the slot (fewer than it holds)."""

    @abstractmethod
    def _free(self, slot: int) -> None:
        """Drop what the slot holds."""

    @abstractmethod
    def _export(
        self, slot: int, length: int
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Copies of the slot's first ``length`` keys and values, per layer."""

    @abstractmethod
    def _import(self, slot: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Fill an empty slot with checked per-layer ``(keys, values)`` on the model's device."""

    # --- checks ------------------------------------------------------------------------------

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_num_seqs:
            raise ValueError(f"slot {slot} is out of range [0, {self.max_num_seqs})")

    def _check_input(self, item: ForwardInput) -> None:
        self._check_slot(item.slot)
        n = len(item.token_ids)
        if n == 0:
            raise ValueError(f"slot {item.slot}: token_ids is empty")
        if not 1 <= item.num_logits <= n:
            raise ValueError(
                f"slot {item.slot}: num_logits={item.num_logits} is outside [1, {n}] "
                f"(the number of tokens fed)"
            )
        if any(not 0 <= j < item.num_logits for j in item.no_logits):
            raise ValueError(
                f"slot {item.slot}: no_logits {item.no_logits} outside [0, {item.num_logits})"
            )
        sparse_rows = [j for j, _ in item.sparse_logits]
        if any(not 0 <= j < item.num_logits or j in item.no_logits for j in sparse_rows) or len(
            set(sparse_rows)
        ) != len(sparse_rows):
            raise ValueError(
                f"slot {item.slot}: sparse_logits rows {sparse_rows} must be distinct rows in "
                f"[0, {item.num_logits}) outside no_logits"
            )
        if any(not 0 <= t < self.vocab_size for _, ids in item.sparse_logits for t in ids):
            raise ValueError(f"slot {item.slot}: a sparse_logits token outside the vocabulary")
        total = self._lengths[item.slot] + n
        if total > self.max_len:
            raise ValueError(
                f"slot {item.slot}: {self._lengths[item.slot]} cached + {n} new tokens = {total} "
                f"exceeds {self._max_len_name}={self.max_len}"
            )
        bad = [t for t in item.token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"slot {item.slot}: token ids {bad[:5]} outside [0, {self.vocab_size})"
            )

    def _check_state(self, state: KVState) -> None:
        layers = (len(state.keys), len(state.values))
        if state.length > 0 and layers != (self._num_layers, self._num_layers):
            raise ValueError(
                f"KV state has {layers} key/value layers; the model has {self._num_layers}"
            )
        if state.length > self.max_len:
            raise ValueError(
                f"KV state of {state.length} tokens exceeds {self._max_len_name}={self.max_len}"
            )
        for tensor in (*state.keys, *state.values):
            if tensor.dtype != self.model.dtype or tensor.shape[-2] != state.length:
                raise ValueError(
                    f"KV state tensor {tuple(tensor.shape)} {tensor.dtype} does not match "
                    f"length {state.length} and model dtype {self.model.dtype}"
                )


class ModelRunner(SlotRunner):
    """Runs a causal LM over ``max_num_seqs`` sequence slots, each with its own KV cache, one
    batch-1 forward per input.

    A slot starts empty; :meth:`forward` appends to it, :meth:`crop` shortens it, :meth:`free`
    empties it. Slots are independent: nothing in one slot affects another's logits.
    """

    def __init__(self, model: LoadedModel, *, max_num_seqs: int) -> None:
        super().__init__(
            model,
            max_num_seqs=max_num_seqs,
            max_len=model.max_model_len,
            max_len_name="max_model_len",
        )
        self._caches: list[Any] = [None] * max_num_seqs  # a transformers DynamicCache, or None
        self._cache_kwarg = cache_kwarg_name(model.model)
        self._num_layers = len(self._new_cache().layers)

    def _run(self, inputs: Sequence[ForwardInput]) -> torch.Tensor:
        return torch.cat([self._run_one(item) for item in inputs])

    def _run_one(self, item: ForwardInput) -> torch.Tensor:
        start = self._lengths[item.slot]
        device = self.model.device
        ids = torch.tensor([list(item.token_ids)], dtype=torch.long, device=device)
        positions = torch.arange(start, start + ids.shape[1], device=device).unsqueeze(0)
        kwargs = {self._cache_kwarg: self._cache_of(item.slot)}
        with torch.inference_mode():
            out = self.model.model(
                input_ids=ids,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=item.num_logits,
                **kwargs,
            )
        self._lengths[item.slot] = start + ids.shape[1]
        logits: torch.Tensor = out.logits[0, -item.num_logits :]
        return logits

    def _crop(self, slot: int, length: int) -> None:
        with torch.inference_mode():
            self._caches[slot].crop(length - self._lengths[slot])  # negative: tokens to remove

    def _free(self, slot: int) -> None:
        self._caches[slot] = None

    def _export(
        self, slot: int, length: int
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        layers = self._caches[slot].layers
        keys = tuple(layer.keys.clone() for layer in layers)
        values = tuple(layer.values.clone() for layer in layers)
        return keys, values

    def _import(self, slot: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._caches[slot] = self._new_cache(data)  # copies: the cache grows by concatenation

    def _cache_of(self, slot: int) -> Any:
        """The slot's DynamicCache, created empty on first use."""
        if self._caches[slot] is None:
            self._caches[slot] = self._new_cache()
        return self._caches[slot]

    def _new_cache(self, data: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
        with torch.inference_mode():
            return transformers.DynamicCache(data, config=self.model.model.config)


def cache_kwarg_name(model: Any) -> str:
    """``cache`` (transformers >= 5.24) or ``past_key_values`` (earlier): the forward argument
    that takes the KV cache."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
