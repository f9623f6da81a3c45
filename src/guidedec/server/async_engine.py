"""The engine behind the server: one thread steps the LLM; coroutines stream their tokens.

The engine thread owns the ``LLM``: requests and aborts reach it through a queue, and after
every step it hands each waiting coroutine its new tokens (``loop.call_soon_threadsafe``). Many
clients therefore share each batch, and the event loop never waits for a step or a compilation.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from guidedec.engine import LLM, RequestOutput, SamplingParams
from guidedec.engine.logprobs import TokenLogprob
from guidedec.engine.prompts import Prompt

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Delta:
    """New tokens of a request, or its end (``output`` set)."""

    token_ids: list[int]
    output: RequestOutput | None = None
    error: Exception | None = None  # the request could not be queued
    logprobs: list[TokenLogprob] | None = None  # of token_ids, when the request asked


@dataclass(eq=False)
class _Stream:
    prompt: Prompt
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Delta] = field(default_factory=asyncio.Queue)
    request_id: int | None = None
    sent: int = 0
    cancelled: bool = False

    def push(self, delta: Delta) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, delta)


class AsyncEngine:
    """Runs ``llm`` in a daemon thread; ``generate`` streams one request's tokens."""

    def __init__(self, llm: LLM, *, idle_wait_s: float = 0.05) -> None:
        self.llm = llm
        self._inbox: queue.Queue[tuple[str, _Stream]] = queue.Queue()
        self._streams: dict[int, _Stream] = {}
        self._idle_wait_s = idle_wait_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guidedec-engine", daemon=True)
        self._thread.start()

    async def generate(self, prompt: Prompt, params: SamplingParams) -> AsyncIterator[Delta]:
        """Yield the request's new tokens after each step, then a last ``Delta`` with its
        output. Leaving early (a client that disconnects) aborts the request."""
        stream = _Stream(prompt, params, asyncio.get_running_loop())
        self._inbox.put(("add", stream))
        finished = False
        try:
            while not finished:
                delta = await stream.queue.get()
                if delta.error is not None:
                    raise delta.error
                finished = delta.output is not None
                yield delta
        finally:
            if not finished:
                stream.cancelled = True
                self._inbox.put(("abort", stream))

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    @property
    def num_active(self) -> int:
        """Requests the engine is working on (for health checks and tests)."""
        return len(self._streams)

    # --- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._drain_inbox(block=not self.llm.has_unfinished_requests())
            if self.llm.has_unfinished_requests():
                try:
                    finished = self.llm.step()
                except Exception as exc:  # a bug must fail the requests, not hang them
                    logger.exception("engine step failed")
                    self._fail_all(exc)
                    continue
                self._publish(finished)

    def _fail_all(self, exc: Exception) -> None:
        error = RuntimeError(f"the engine failed: {exc}")
        for request_id, stream in list(self._streams.items()):
            self.llm.abort(request_id)
            stream.push(Delta([], error=error))
        self._streams.clear()

    def _drain_inbox(self, *, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self._idle_wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, stream: _Stream) -> None:
        if kind == "abort":
            if stream.request_id is not None:
                self.llm.abort(stream.request_id)
                # Counted no more now: with nothing else to run, no step reports the abort.
                self._streams.pop(stream.request_id, None)
            return
        if stream.cancelled:
            return
        try:
            stream.request_id = self.llm.add_request(stream.prompt, stream.params)
        except ValueError as exc:
            stream.push(Delta([], error=exc))
            return
        self._streams[stream.request_id] = stream

    def _publish(self, finished: list[RequestOutput]) -> None:
        for output in finished:
            stream = self._streams.pop(output.request_id, None)
            if stream is not None and not stream.cancelled:
                logprobs = None if output.logprobs is None else output.logprobs[stream.sent :]
                stream.push(Delta(output.token_ids[stream.sent :], output, logprobs=logprobs))
        for request_id, stream in self._streams.items():
            tokens = self.llm.output_so_far(request_id)
            if tokens is not None and len(tokens) > stream.sent and not stream.cancelled:
                logprobs = self.llm.logprobs_so_far(request_id)
                if logprobs is not None:
                    logprobs = logprobs[stream.sent : len(tokens)]
                stream.push(Delta(tokens[stream.sent :], logprobs=logprobs))
                stream.sent = len(tokens)
