"""CapturableGuidedDecoder: the host work of a step as host functions on the CUDA stream, so that
a decode step can be captured in a CUDA graph with guided decoding inside, and replayed.

A CUDA graph replays device work only; Python code that ran while it was captured does not run
again. So the host side of a step (fetching the new tokens, advancing matchers, filling rows,
rolling back) is enqueued on the stream as host functions (:mod:`guidedec.decoder.hostfunc`),
which a capture records as host nodes that run at every replay, in stream order.

State crosses from the caller to the host functions through a queue: ``add_batch`` (ordinary
host code, before the replay) puts the batch snapshot there, and the ``fetch_batch`` host
function takes it. ``self.requests`` is the caller's snapshot and ``self.requests_hostfunc`` the
host functions' one (while a host function runs, ``in_host_function`` is True and every method
reads the latter). Tokens sampled on the device reach the host functions through pinned buffers
(``new_tokens`` ``[max_num_draft_tokens + 1, max_num_sequences]``, by position then slot, and
``num_accepted_tokens``), copied without blocking.

Rules the reference design learned the hard way, kept here:

- CUDA-graph warm-up runs a captured step several times for one ``add_batch``: a
  ``fetch_batch`` that finds the queue empty does nothing, and ``build_hostfunc`` then builds
  nothing either (building the snapshot it has again would advance its matchers twice); each
  queued snapshot is built exactly once.
- A host function needs the GIL. A caller that enters native code which holds the GIL while it
  waits for the device (a kernel-module load, some extensions) deadlocks if a host function is
  still pending: :meth:`drain_host_functions` waits on ``bitmask_event`` (releasing the GIL) first.
  It does nothing while capturing (a host wait is illegal there).
- Host functions cannot return values: failures collect in the decoder and
  :meth:`pop_failures` hands them out after a drain.

On the CPU every host function runs at once, in the same order, so the decoder is a
:class:`GuidedDecoder` with the same results; the tests call each host function directly
(``method.run_now``) in the order a graph would run them.

Only the target step and the rollback of rejected tokens are host functions; a drafting loop
(``add_draft_batch`` / ``execute_draft_batch``) runs as ordinary host code.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from guidedec.decoder.decoder import Failure, GuidedDecoder, TokenCounts
from guidedec.decoder.hostfunc import hostfunc, raise_pending_error
from guidedec.decoder.request import GuidedRequest, GuidedRequests

__all__ = ["CapturableGuidedDecoder"]


class CapturableGuidedDecoder(GuidedDecoder):
    """A :class:`GuidedDecoder` whose step can be captured in a CUDA graph (see the module
    docstring for the protocol). Same constructor arguments."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        pinned = self.device.type == "cuda"
        self.requests_hostfunc: GuidedRequests | None = None
        self.queue: deque[tuple[GuidedRequests, bool]] = deque()
        self.new_tokens = torch.zeros(
            self.max_num_draft_tokens + 1,
            self.max_num_sequences,
            dtype=torch.int32,
            pin_memory=pinned,
        )
        self.num_accepted_tokens = torch.zeros(
            self.max_num_sequences, dtype=torch.int32, pin_memory=pinned
        )
        self.in_host_function = False
        self._failures: list[Failure] = []
        self._unbuilt = False  # a batch was fetched and not built yet

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
        self.set_batch(requests, num_draft_tokens=num_draft_tokens)
        if new_tokens is not None:
            tokens = new_tokens.squeeze(-1) if new_tokens.dim() == 3 else new_tokens
            if tuple(tokens.shape) != tuple(self.new_tokens.shape):
                raise ValueError(
                    f"new_tokens must be {tuple(self.new_tokens.shape)} (positions x slots), "
                    f"got {tuple(new_tokens.shape)}"
                )
            self.new_tokens.copy_(tokens, non_blocking=True)  # ordered before the side stream
        assert self.requests is not None
        self.queue.append((self.requests, new_tokens is not None))

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
            self.copy_bitmask(num_rows)
            self.sync.record_bitmask()
        self.sync.wait_bitmask()
        self.apply_bitmask(logits, d2t=d2t, num_rows=num_rows)
        return [] if self.sync.on_cuda else self.pop_failures()

    def rollback_rejected_batch(self, num_accepted_tokens: TokenCounts) -> list[Failure]:
        """:meth:`GuidedDecoder.rollback_rejected_batch` through host functions.

        Call after the kernels that follow verification are enqueued (the host functions need
        the GIL; see :meth:`drain_host_functions`, which this calls). ``num_accepted_tokens``
        may be a device tensor (it is copied without blocking).
        """
        batch = self._batch()
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

    def _batch(self) -> GuidedRequests:
        if not self.in_host_function:
            return super()._batch()
        if self.requests_hostfunc is None:
            raise RuntimeError("no batch for the host functions yet: add_batch, then fetch_batch")
        return self.requests_hostfunc

    # --- host functions (stream order; callable directly with ``.run_now(decoder)``) ------------

    @hostfunc
    def fetch_batch(self) -> None:
        """Take the next queued batch; fill its tokens from ``new_tokens`` if it came with them.
        An empty queue (a warm-up replay) leaves everything as it is."""
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
        self.requests_hostfunc, self._unbuilt = batch, True

    def _with_new_tokens(self, req: GuidedRequest) -> GuidedRequest:
        """``req`` with the new token and drafts the device wrote for its slot (guided requests
        of the previous step only)."""
        if req.guided_decoding_params is None or req.prev_seq_slot is None:
            return req
        new_token, *drafts = self.new_tokens[:, req.seq_slot].tolist()
        return replace(req, new_token=new_token, draft_tokens=tuple(drafts))

    @hostfunc
    def build_hostfunc(self) -> None:
        """:meth:`build` on the host functions' batch, once per fetched batch (nothing after a
        ``fetch_batch`` that found the queue empty)."""
        if not self._unbuilt:
            return
        self._unbuilt = False
        self._failures += self.build()

    @hostfunc
    def rollback_accepted_hostfunc(self) -> None:
        """Roll back what verification rejected, by ``num_accepted_tokens``."""
        batch = self._batch()
        counts = self.num_accepted_tokens[: len(batch)].tolist()
        self._failures += self._rollback_rejected(batch.requests, counts)

    @hostfunc
    def rollback_draft_hostfunc(self) -> None:
        """:meth:`rollback_draft_tokens` on the host functions' batch."""
        self._failures += self.rollback_draft_tokens()

    @hostfunc
    def init_disagg_hostfunc(self) -> None:
        """:meth:`init_disagg_gen_requests` on the host functions' batch."""
        self._failures += self.init_disagg_gen_requests()
