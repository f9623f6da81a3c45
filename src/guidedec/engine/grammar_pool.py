"""Grammar compilation off the step loop.

A thread pool compiles each request's guide into the matcher factory's cache as the request
arrives (``factory.compile``; the backends release the GIL while compiling); the request waits
for a slot only once its grammar is ready, and the decoder's later ``factory.create`` of its one
matcher is a cache hit. Requests behind a slow grammar are not held up, and the step loop never
compiles.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Iterator

from guidedec.engine.request import Request, Status
from guidedec.grammar.host import lower_priority
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams


class GrammarPool:
    """Compiles guides in ``max_workers`` threads, each bounded by ``timeout_s`` seconds.

    A compilation that outlives its timeout cannot be interrupted (it runs in native code); its
    request is finished with ``grammar_error`` and the result, when it comes, only warms the cache.
    """

    def __init__(
        self, factory: GrammarMatcherFactory, *, max_workers: int = 2, timeout_s: float = 60.0
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"compile timeout must be positive, got {timeout_s}")
        self.factory = factory
        self.timeout_s = timeout_s
        # Compiles run at a lower priority than the step loop (host.COMPILE_NICENESS).
        self._executor = cf.ThreadPoolExecutor(
            max_workers, thread_name_prefix="guidedec-compile", initializer=lower_priority
        )
        self._pending: dict[Request, cf.Future[object]] = {}
        # One compilation per distinct guide in flight: requests with the same guide share it.
        self._inflight: dict[GuidedDecodingParams, cf.Future[object]] = {}
        self._lock = threading.Lock()  # _inflight is also touched by the workers' callbacks

    def submit(self, request: Request) -> None:
        """Start compiling ``request``'s guide; the request waits in ``COMPILING`` meanwhile."""
        params = request.params.guided_decoding
        if params is None:
            request.status = Status.WAITING
            return
        request.status = Status.COMPILING
        with self._lock:
            future = self._inflight.get(params)
            if future is None:
                future = self._executor.submit(self.factory.compile, params)
                self._inflight[params] = future
        future.add_done_callback(lambda f: self._forget(params, f))
        self._pending[request] = future

    def _forget(self, params: GuidedDecodingParams, future: cf.Future[object]) -> None:
        with self._lock:
            if self._inflight.get(params) is future:
                del self._inflight[params]

    def poll(self) -> Iterator[Request]:
        """Move requests whose grammar is ready to ``WAITING``; yield those that failed (already
        finished with ``grammar_error``)."""
        now = time.perf_counter()
        for request, future in list(self._pending.items()):
            if request.is_finished:
                del self._pending[request]
            elif future.done():
                del self._pending[request]
                if self._settle(request, future):
                    yield request
            elif now - request.metrics.arrival > self.timeout_s:
                del self._pending[request]
                request.finish(
                    "grammar_error", f"grammar compilation timed out after {self.timeout_s:g} s"
                )
                yield request

    def _settle(self, request: Request, future: cf.Future[object]) -> bool:
        error = future.exception()
        if error is not None:
            request.finish("grammar_error", f"invalid guide: {error}")
            return True
        request.status = Status.WAITING
        request.metrics.grammar_ready = time.perf_counter()
        return False

    def wait(self) -> None:
        """Block until a pending compilation finishes or the oldest one's timeout passes."""
        if not self._pending:
            return
        oldest = min(r.metrics.arrival for r in self._pending)
        remaining = max(0.0, oldest + self.timeout_s - time.perf_counter())
        cf.wait(self._pending.values(), timeout=remaining, return_when=cf.FIRST_COMPLETED)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
