"""The two-stream protocol of a step on a CUDA device, and its synchronous stand-in on the CPU.

The host bitmask is copied to the device on a side stream, so that the copy overlaps whatever
the main stream still runs. Two events order it:

- ``token_event``, recorded on the main stream right before the side stream starts: the side
  stream waits for it, so it never reads tokens the main stream has not written yet (the
  sampled tokens copied to pinned memory) nor overwrites a device bitmask the main stream still
  reads. Recording it there, not at the end of the previous step, keeps the record inside a
  CUDA-graph capture, where a wait on an event recorded outside the capture is not allowed;
- ``bitmask_event``, recorded on the side stream once the copy (and any host function) is
  enqueued: the main stream waits for it before the apply kernel reads the device bitmask.

On the CPU every call is synchronous and the events are no-ops. ``trace``, when set to a list,
records each step of the protocol by name, on any device: tests check the order with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class StepSync:
    """A decoder's side stream and events (``device`` CUDA), or nothing to do (CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.on_cuda = device.type == "cuda"
        self.trace: list[str] | None = None
        if self.on_cuda:
            self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            self.token_event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.bitmask_event = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def note(self, step: str) -> None:
        """Record ``step`` in ``trace`` (when tracing)."""
        if self.trace is not None:
            self.trace.append(step)

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        """Run the block on the side stream, after everything enqueued on the main stream."""
        self.record_token()
        self.note("side: wait token_event")
        if not self.on_cuda:
            yield
            return
        with torch.cuda.stream(self.stream):
            torch.cuda.current_stream().wait_event(self.token_event)
            yield

    def record_bitmask(self) -> None:
        """On the side stream: everything enqueued so far is what the apply needs."""
        self.note("side: record bitmask_event")
        if self.on_cuda:
            self.bitmask_event.record()

    def wait_bitmask(self) -> None:
        """On the main stream: wait for the side stream's copy (this joins the side stream,
        as CUDA-graph capture requires of every stream it forks)."""
        self.note("main: wait bitmask_event")
        if self.on_cuda:
            torch.cuda.current_stream().wait_event(self.bitmask_event)

    def record_token(self) -> None:
        """On the main stream: what the side stream must wait for is enqueued."""
        self.note("main: record token_event")
        if self.on_cuda:
            self.token_event.record()

    def drain(self) -> None:
        """Wait, releasing the GIL, until every host function enqueued before the last
        ``bitmask_event`` has run. Not while capturing: a host wait is illegal there, and
        captured host functions only run at replay."""
        self.note("host: drain")
        if self.on_cuda and not torch.cuda.is_current_stream_capturing():
            self.bitmask_event.synchronize()
