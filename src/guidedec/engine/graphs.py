"""Decode steps as replays of captured graphs, with guided decoding inside the graph.

A pure decode step (every sequence feeds one token and wants one row of logits) of ``B``
sequences runs the same kernels on the same buffers for any ``B`` up to a padded size ``P``
(1, 2, 4, 8, ... up to ``max_num_seqs``, :func:`padded_size`); only the token ids, positions and
slots change. :class:`DecodeGraphs` captures such a step once per ``(P, guided)`` and replays it:

1. the caller queues the step's guided snapshots (``CapturableGuidedDecoder.add_batch``);
2. :meth:`DecodeGraphs.run` writes the token ids, positions and slots into the graph's static
   input tensor (rows past ``B`` feed token 0 at position 0 of the runner's scratch slot),
   captures the graph on first use of the key, and replays it. The captured region is one
   batched forward of the ``P`` rows
   (:meth:`~guidedec.engine.batched_runner.BatchedModelRunner.forward_packed`, each row
   attending over its own slot of the static cache) writing a static ``[P, V]`` logits tensor,
   then, for a guided batch, the decoder's ``execute(logits, num_rows=P)``: host functions that
   fetch the queued snapshot, advance the matchers and fill the bitmask, the copy, and the apply
   kernel over all ``P`` rows (rows past the batch are not live, so they stay as they are);
3. it waits for the replay (``drain_after_replay``), collects the failed requests, records the
   new cached lengths and returns the first ``B`` rows of the static logits, which the next run
   overwrites.

Each real replay takes exactly one queued snapshot, because nothing else runs the host
functions: warm-up runs only the forwards and the apply kernel (loading kernels and allocating
workspaces before capture), and a capture records host functions without running them.

:class:`StepGraph` hides the device: on CUDA it is a ``torch.cuda.CUDAGraph``; on the CPU there
is no graph, so a replay calls the captured function again. The static-buffer discipline (inputs
written into static tensors, outputs read from static tensors, no host bookkeeping inside the
captured function) is the same on both, which is what lets the CPU tests check it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from guidedec.decoder.capturable import CapturableGuidedDecoder
from guidedec.decoder.decoder import Failure
from guidedec.engine.batched_runner import BatchedModelRunner, PackedBatch
from guidedec.engine.runner import ForwardInput
from guidedec.engine.slot_attention import attention_group

MAX_GRAPHS = 16
"""Graphs kept by default (every padded size up to 128 slots, guided and not); the least
recently used one is dropped to capture a new one."""
CUDA_WARMUP_RUNS = 2
"""Eager runs of the warm-up before a CUDA capture (torch's examples use a few)."""

GraphKey = tuple[int, bool]  # (padded batch size, guided)


class StepGraph(ABC):
    """One step captured once and replayed many times.

    ``capture(fn, warmup=...)`` runs ``warmup`` outside the capture, then captures ``fn``;
    ``replay()`` runs what ``fn`` captured. ``fn`` must read its inputs from, and write its
    outputs to, tensors that outlive the graph, and do nothing on the host that a replay would
    need again.
    """

    @abstractmethod
    def capture(self, fn: Callable[[], None], *, warmup: Callable[[], None] | None = None) -> None:
        """Capture ``fn`` (once per graph)."""

    @abstractmethod
    def replay(self) -> None:
        """Run the captured step again, on the current stream."""


class HostStepGraph(StepGraph):
    """The CPU stand-in: no graph, a replay calls the captured function again.

    As on CUDA, capturing does not run ``fn`` (a CUDA capture records kernels without running
    them); the warm-up runs once, so that tests see it change nothing.
    """

    def __init__(self) -> None:
        self._fn: Callable[[], None] | None = None

    def capture(self, fn: Callable[[], None], *, warmup: Callable[[], None] | None = None) -> None:
        if self._fn is not None:
            raise ValueError("this StepGraph has already captured a step")
        if warmup is not None:
            warmup()
        self._fn = fn

    def replay(self) -> None:
        if self._fn is None:
            raise ValueError("replay before capture")
        self._fn()


class CudaStepGraph(StepGraph):
    """A ``torch.cuda.CUDAGraph``: warm-up on a side stream, then capture on it.

    The capture uses ``capture_error_mode="thread_local"``: the engine's other threads (the
    grammar pool compiling, the overlap worker) do no CUDA work the graph needs, and a CUDA call
    of theirs during a capture must not invalidate it.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._graph: torch.cuda.CUDAGraph | None = None
        self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def capture(self, fn: Callable[[], None], *, warmup: Callable[[], None] | None = None) -> None:
        if self._graph is not None:
            raise ValueError("this StepGraph has already captured a step")
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for _ in range(CUDA_WARMUP_RUNS):
                if warmup is not None:
                    warmup()
        torch.cuda.current_stream(self.device).wait_stream(self._stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
            fn()
        self._graph = graph

    def replay(self) -> None:
        if self._graph is None:
            raise ValueError("replay before capture")
        self._graph.replay()


def new_step_graph(device: torch.device) -> StepGraph:
    """A :class:`CudaStepGraph` on a CUDA device, else a :class:`HostStepGraph`."""
    return CudaStepGraph(device) if device.type == "cuda" else HostStepGraph()


def is_decode_step(inputs: Sequence[ForwardInput]) -> bool:
    """Whether ``inputs`` is a step :class:`DecodeGraphs` runs: at least one input, each one
    token with one row of logits (no prefill chunk, no drafts to verify)."""
    return bool(inputs) and all(len(i.token_ids) == 1 and i.num_logits == 1 for i in inputs)


def padded_size(batch_size: int, max_num_seqs: int) -> int:
    """The graph size a decode step of ``batch_size`` sequences runs at: the next power of two,
    at most ``max_num_seqs``."""
    return min(1 << (batch_size - 1).bit_length(), max_num_seqs)


def decode_batch(runner: BatchedModelRunner, inputs: torch.Tensor) -> PackedBatch:
    """The packed batch of a decode step from a static ``[3, P]`` tensor (token ids, positions,
    slots): one attention group over the runner's whole static cache, its mask computed on the
    device, so building it reads nothing on the host."""
    rows = torch.arange(inputs.shape[1], device=inputs.device)
    ids, positions, slots = inputs[0:1], inputs[1:2], inputs[2]
    group = attention_group(
        slots, rows.unsqueeze(1), positions[0].unsqueeze(1), runner.max_len, runner.model.dtype
    )
    return PackedBatch(ids, positions, slots, rows, (group,))


@dataclass(slots=True)
class _Entry:
    """One captured step and the static tensors it reads and writes."""

    graph: StepGraph
    inputs: torch.Tensor  # [3, P] int64: the token ids, their positions, their slots
    logits: torch.Tensor  # [P, V], the model's dtype
    failures: list[Failure] = field(default_factory=list)  # CPU: what execute returned


class DecodeGraphs:
    """Pure decode steps of a static :class:`BatchedModelRunner` as graph replays, one graph per
    ``(padded size, guided)``, at most ``max_graphs`` of them (least recently used dropped
    first).

    Args:
        runner: The runner whose static cache the graphs write (built with ``static=True``).
        decoder: The guided decoder whose ``execute`` a guided graph captures.
        max_graphs: Graphs kept at once (at least 1).
    """

    def __init__(
        self,
        runner: BatchedModelRunner,
        decoder: CapturableGuidedDecoder,
        *,
        max_graphs: int = MAX_GRAPHS,
    ) -> None:
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be at least 1, got {max_graphs}")
        if not runner.static:
            raise ValueError("graphs need a runner built with static=True (fixed cache storage)")
        self.runner, self.decoder, self.max_graphs = runner, decoder, max_graphs
        self.captures = 0  # graphs captured so far (a dropped key captures again)
        self._entries: OrderedDict[GraphKey, _Entry] = OrderedDict()

    def cached_keys(self) -> list[GraphKey]:
        """The kept graphs' keys, least recently used first."""
        return list(self._entries)

    def run(
        self, inputs: Sequence[ForwardInput], *, guided: bool
    ) -> tuple[torch.Tensor, list[Failure]]:
        """Run one decode step by graph replay.

        Call ``decoder.add_batch`` with the step's snapshots first when ``guided`` (and only
        then): the replay takes exactly that one queued snapshot.

        Returns:
            The logits, ``[len(inputs), vocab_size]`` as :meth:`BatchedModelRunner.forward`
            returns them (masked by the grammars when ``guided``): a view of the graph's static
            tensor, valid until the next run; and the requests the decoder failed in this step.

        Raises:
            ValueError: ``inputs`` that are not a decode step (:func:`is_decode_step`), or that
                :meth:`BatchedModelRunner.forward` refuses. Nothing is run then.
        """
        if not is_decode_step(inputs):
            raise ValueError("a graph step feeds each slot one token and wants one logits row")
        self.runner.check_inputs(inputs)
        key: GraphKey = (padded_size(len(inputs), self.runner.max_num_seqs), guided)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._new_entry(key)
            self._write_inputs(entry, inputs)  # before the warm-up, which runs the real step
            self._capture(entry, key)
            self._entries[key] = entry  # kept only once captured
        else:
            self._entries.move_to_end(key)
            self._write_inputs(entry, inputs)
        entry.graph.replay()
        failures = self._finish(entry, guided)
        for item in inputs:
            self.runner.advance(item.slot, 1)
        return entry.logits[: len(inputs)], failures

    def _new_entry(self, key: GraphKey) -> _Entry:
        """Static tensors for a new graph, after dropping the least recently used ones."""
        while len(self._entries) >= self.max_graphs:
            self._entries.popitem(last=False)
        model, size = self.runner.model, key[0]
        inputs = torch.zeros(3, size, dtype=torch.long, device=model.device)
        logits = torch.zeros(size, self.runner.vocab_size, dtype=model.dtype, device=model.device)
        return _Entry(new_step_graph(model.device), inputs, logits)

    def _write_inputs(self, entry: _Entry, inputs: Sequence[ForwardInput]) -> None:
        padding = entry.inputs.shape[1] - len(inputs)
        ids = [item.token_ids[0] for item in inputs] + [0] * padding
        positions = [self.runner.num_cached(item.slot) for item in inputs] + [0] * padding
        slots = [item.slot for item in inputs] + [self.runner.scratch_slot] * padding
        host = torch.tensor([ids, positions, slots], dtype=torch.long)
        entry.inputs.copy_(host, non_blocking=True)

    def _capture(self, entry: _Entry, key: GraphKey) -> None:
        size, guided = key

        def forward() -> None:
            entry.logits.copy_(self.runner.forward_packed(decode_batch(self.runner, entry.inputs)))

        def step() -> None:
            forward()
            if guided:
                # On the CPU execute runs its host functions at once and returns the failures;
                # on CUDA it returns [] and they come from pop_failures after the replay.
                entry.failures = self.decoder.execute(entry.logits, num_rows=size)

        def warmup() -> None:
            # The forward writes the step's own keys and values at its own positions, which the
            # replay writes again. The decoder part is only the apply kernel, on whatever mask
            # is in the device buffers (the replay recomputes the logits): its host functions
            # would take the queued snapshot, which the replay after the capture must build.
            forward()
            if guided:
                self.decoder.apply_bitmask(entry.logits, num_rows=size)

        entry.graph.capture(step, warmup=warmup)
        self.captures += 1

    def _finish(self, entry: _Entry, guided: bool) -> list[Failure]:
        """Wait for a guided replay's host functions and collect its failed requests."""
        if not guided:
            return []  # the caller's first read of the logits waits for the replay
        self.decoder.drain_after_replay()
        failures, entry.failures = [*entry.failures, *self.decoder.pop_failures()], []
        return failures
