"""CapturableGuidedDecoder: a :class:`GuidedDecoder`'s step as host functions on the CUDA stream,
so that a decode step can be captured in a CUDA graph with guided decoding inside, and replayed.

A CUDA graph replays device work only; Python code that ran while it was captured does not run
again. So the host side of a step (fetching the new tokens, advancing matchers, filling rows,
rolling back) is enqueued on the stream as host functions (:mod:`guidedec.decoder.hostfunc`),
which a capture records as host nodes that run at every replay, in stream order.

The capturable decoder wraps the :class:`GuidedDecoder` that does the work, and owns only what
crosses from the caller to the host functions. ``add_batch`` (ordinary host code, before the
replay) checks the step's snapshot and puts it in a queue; the ``fetch_batch`` host function takes
it and hands it to the wrapped decoder (``decoder.requests``), whose ``build`` and rollbacks the
other host functions run. ``self.requests`` is the caller's last snapshot, which decides the rows
that the caller's copy and apply cover; the wrapped decoder's is the one its host functions are
on, which on a GPU may still be the previous step's. Tokens sampled on the device reach the host
functions through pinned buffers (``new_tokens`` ``[max_num_draft_tokens + 1,
max_num_sequences]``, by position then slot, and ``num_accepted_tokens``), copied without
blocking.

Rules the reference design learned the hard way, kept here:

- CUDA-graph warm-up runs a captured step several times for one ``add_batch``: a
  ``fetch_batch`` that finds the queue empty does nothing, and ``build_hostfunc`` then builds
  nothing either (building the snapshot it has again would advance its matchers twice); each
  queued snapshot is built exactly once.
- A host function needs the GIL. A caller that enters native code which holds the GIL while it
  waits for the device (a kernel-module load, some extensions) deadlocks if a host function is
  still pending: :meth:`drain_host_functions` waits on ``bitmask_event`` (releasing the GIL) first.
  It does nothing while capturing (a host wait is illegal there).
- Host functions cannot return values: failures collect here and :meth:`pop_failures` hands
  them out after a drain.

On the CPU every host function runs at once, in the same order, so the wrapper gives the wrapped
decoder's results; the tests call each host function directly (``method.run_now``) in the order
a graph would run them.

Only the target step and the rollback of rejected tokens are host functions. An eager step (a
prefill chunk, anything not captured) and a drafting loop (``add_draft_batch`` /
``execute_draft_batch``) call the wrapped decoder directly, as ordinary host code, never while
host functions are pending.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import torch

from guidedec.decoder.decoder import Failure, GuidedDecoder, TokenCounts
from guidedec.decoder.hostfunc import hostfunc, raise_pending_error
from guidedec.decoder.request import GuidedRequest, GuidedRequests
from guidedec.decoder.streams import StepSync

__all__ = ["CapturableGuidedDecoder"]


class CapturableGuidedDecoder:
    """The step of ``decoder`` as host functions, for a CUDA graph to capture (see the module
    docstring for the protocol)."""

    def __init__(self, decoder: GuidedDecoder) -> None:
        self.decoder = decoder
        pinned = decoder.device.type == "cuda"
        self.requests: GuidedRequests | None = None  # the caller's last snapshot
        self.queue: deque[tuple[GuidedRequests, bool]] = deque()
        self.new_tokens = torch.zeros(
            decoder.max_num_draft_tokens + 1,
            decoder.max_num_sequences,
            dtype=torch.int32,
            pin_memory=pinned,
        )
        self.num_accepted_tokens = torch.zeros(
            decoder.max_num_sequences, dtype=torch.int32, pin_memory=pinned
        )
        self._failures: list[Failure] = []
        self._unbuilt = False  # a batch was fetched and not built yet

    @property
    def device(self) -> torch.device:
        """The wrapped decoder's device (where host functions are enqueued)."""
        return self.decoder.device

    @property
    def sync(self) -> StepSync:
        """The wrapped decoder's streams and events."""
        return self.decoder.sync

    # --- caller side ----------------------------------------------------------------------------

    def add_batch(
        self,
        requests: Sequence[GuidedRequest],
        *,
        num_draft_tokens: int | None = None,
        new_tokens: torch.Tensor | None = None,
    ) -> None:
        """Queue this step's snapshots for the host functions.

        Args:
            requests: As for :meth:`GuidedDecoder.add_batch`.
            num_draft_tokens: As for :meth:`GuidedDecoder.add_batch`.
            new_tokens: Optional int tensor ``[max_num_draft_tokens + 1, max_num_sequences]``
                (a trailing dimension of 1 is dropped), on any device: the tokens sampled in
                the previous step by position and slot. Requests with a ``prev_seq_slot`` take
                their ``new_token`` and ``draft_tokens`` from it when ``fetch_batch`` runs, so
                that the caller need not wait for the device to build their snapshots.
        """
        batch = self.decoder.snapshot(requests, num_draft_tokens=num_draft_tokens)
        if new_tokens is not None:
            tokens = new_tokens.squeeze(-1) if new_tokens.dim() == 3 else new_tokens
            if tuple(tokens.shape) != tuple(self.new_tokens.shape):
                raise ValueError(
                    f"new_tokens must be {tuple(self.new_tokens.shape)} (positions x slots), "
                    f"got {tuple(new_tokens.shape)}"
                )
            self.new_tokens.copy_(tokens, non_blocking=True)  # ordered before the side stream
        self.requests = batch
        self.queue.append((batch, new_tokens is not None))

    def execute(
        self, logits: torch.Tensor, *, d2t: torch.Tensor | None = None, num_rows: int | None = None
    ) -> list[Failure]:
        """Fetch, build and copy on the side stream (host functions), then mask ``logits``.

        ``num_rows``: copy and apply that many rows whatever the batch (a graph captured at a
        padded batch size replays for smaller batches; rows past a batch are not live).
        Returns the failures on the CPU; on a CUDA device the host functions run later, so it
        returns ``[]``: call :meth:`pop_failures` after :meth:`drain_host_functions`.
        """
        with self.sync.side():
            self.fetch_batch()
            self.build_hostfunc()
            self.decoder.copy_rows(self._rows(num_rows))
            self.sync.record_bitmask()
        self.sync.wait_bitmask()
        self.apply_bitmask(logits, d2t=d2t, num_rows=num_rows)
        return [] if self.sync.on_cuda else self.pop_failures()

    def apply_bitmask(
        self, logits: torch.Tensor, *, d2t: torch.Tensor | None = None, num_rows: int | None = None
    ) -> None:
        """:meth:`GuidedDecoder.apply_bitmask` over the rows of the caller's last snapshot (or
        ``num_rows``), whatever batch the host functions are on."""
        self.decoder.apply_rows(logits, self._rows(num_rows), d2t=d2t)

    def rollback_rejected_batch(self, num_accepted_tokens: TokenCounts) -> list[Failure]:
        """:meth:`GuidedDecoder.rollback_rejected_batch` through host functions.

        Call after the kernels that follow verification are enqueued (the host functions need
        the GIL; see :meth:`drain_host_functions`, which this calls). ``num_accepted_tokens``
        may be a device tensor (it is copied without blocking).
        """
        batch = self._caller_batch()
        counts = torch.as_tensor(num_accepted_tokens, dtype=torch.int32)
        if tuple(counts.shape) != (len(batch),):
            raise ValueError(
                f"num_accepted_tokens must have {len(batch)} entries (one per request of the "
                f"last add_batch), got shape {tuple(counts.shape)}"
            )
        self.num_accepted_tokens[: len(batch)].copy_(counts, non_blocking=True)
        with self.sync.side():
            self.rollback_accepted_hostfunc()
            self.sync.record_bitmask()
        self.sync.wait_bitmask()
        self.drain_host_functions()
        return [] if self.sync.on_cuda else self.pop_failures()

    def drain_host_functions(self) -> None:
        """Wait until every host function enqueued so far has run (releasing the GIL), then
        re-raise any exception one of them raised. Does nothing while capturing."""
        self.sync.drain()
        if not (self.sync.on_cuda and torch.cuda.is_current_stream_capturing()):
            raise_pending_error()

    def drain_after_replay(self) -> None:
        """:meth:`drain_host_functions` after a CUDA-graph replay of a captured step.

        Inside a captured graph ``bitmask_event`` is only a dependency between the graph's
        nodes: a replay records no event, and CUDA refuses to wait on an event last recorded
        while capturing. So the event is recorded again on the current stream, after the
        replay (host functions included), and the drain waits on that.
        """
        if self.sync.on_cuda:
            self.sync.bitmask_event.record()
        self.drain_host_functions()

    def pop_failures(self) -> list[Failure]:
        """The requests that failed in host functions that have run, once each."""
        failures, self._failures = self._failures, []
        return failures

    def _caller_batch(self) -> GuidedRequests:
        if self.requests is None:
            raise ValueError("add_batch must be called before execute/apply/rollback")
        return self.requests

    def _rows(self, num_rows: int | None) -> int:
        return self._caller_batch().covered_rows(num_rows, self.decoder.max_num_rows)

    # --- host functions (stream order; callable directly with ``.run_now(wrapper)``) ------------

    @hostfunc
    def fetch_batch(self) -> None:
        """Take the next queued batch and hand it to the wrapped decoder; fill its tokens from
        ``new_tokens`` if it came with them. An empty queue (a warm-up replay) leaves
        everything as it is."""
        if not self.queue:
            return
        queued, has_new_tokens = self.queue.popleft()
        batch = queued
        if has_new_tokens:  # new snapshots: the drafts decide the rows each request owns
            batch = GuidedRequests(
                [self._with_new_tokens(req) for req in queued.requests], queued.num_draft_tokens
            )
            if self.requests is queued:  # still the caller's batch: copy and apply see its rows
                self.requests = batch
        self.decoder.requests, self._unbuilt = batch, True

    def _with_new_tokens(self, req: GuidedRequest) -> GuidedRequest:
        """``req`` with the new token and drafts the device wrote for its slot (guided requests
        of the previous step only)."""
        if req.guided_decoding_params is None or req.prev_seq_slot is None:
            return req
        new_token, *drafts = self.new_tokens[:, req.seq_slot].tolist()
        return replace(req, new_token=new_token, draft_tokens=tuple(drafts))

    @hostfunc
    def build_hostfunc(self) -> None:
        """The wrapped decoder's ``build``, once per fetched batch (nothing after a
        ``fetch_batch`` that found the queue empty)."""
        if not self._unbuilt:
            return
        self._unbuilt = False
        self._failures += self.decoder.build()

    @hostfunc
    def rollback_accepted_hostfunc(self) -> None:
        """Roll back what verification rejected, by ``num_accepted_tokens``."""
        batch = self.decoder.requests  # None: the decoder's rollback says add_batch is missing
        counts = self.num_accepted_tokens[: len(batch or ())].tolist()
        self._failures += self.decoder.rollback_rejected_batch(counts)

    @hostfunc
    def rollback_draft_hostfunc(self) -> None:
        """The wrapped decoder's ``rollback_draft_tokens``."""
        self._failures += self.decoder.rollback_draft_tokens()

    @hostfunc
    def init_disagg_hostfunc(self) -> None:
        """The wrapped decoder's ``init_disagg_gen_requests``."""
        self._failures += self.decoder.init_disagg_gen_requests()
