"""Compile probes in worker processes: a guide that crashes or hangs a backend fails alone.

The backends compile in native code, where a hostile guide can crash the process (a pattern of
30,000 nested groups, 20,000 required names) or run for minutes, and a thread cannot be
stopped. With isolation, a backend factory first compiles each guide it has not compiled yet
in a worker process (and fills the guide's first mask there, where some ``$ref`` chains
crash), under a deadline and a memory limit; only a guide that passed is compiled in the
caller's process. A worker that crashes or passes the deadline is killed, its request gets a
:class:`~guidedec.errors.GrammarError` that says so, and a fresh worker takes its place; the
caller's process and every other request go on.

Why a probe and not a transfer: xgrammar's compiled grammars serialize, but as JSON that holds
the tokenizer and every token mask (185 MB and 12 s for a 16 MB Kubernetes grammar); llguidance
compiles in about a millisecond. So the probe costs one more compile of each new guide (cached
guides cost nothing): a few milliseconds for most guides, as long again for the slow ones. The
second compile cannot be stopped, so a guide whose probe leaves less time before the deadline
than its compile took there fails then: a guide must compile within about half of the timeout.
The first mask is not held against that margin: the caller fills it later, in a step, where the
mask-time limit watches it (llguidance compiles a nested Lark repetition in milliseconds, and
builds its lexer over the first mask's seconds).

Workers are forked from a fork server (a fresh process that imported both backends and, for an
engine on the default tokenizer, built its views), never from the caller, whose other
threads may hold locks. At most ``num_workers`` probes run at once and at most ``max_queued``
wait; a probe that waits longer than its deadline fails like one that runs too long.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from guidedec.errors import GrammarError
from guidedec.grammar.host import (
    heap_in_use,
    limit_memory,
    lower_priority,
    process_alive,
    stop_worker,
)

if TYPE_CHECKING:
    from guidedec.grammar.config import GuidedDecodingConfig
    from guidedec.grammar.params import GuidedDecodingParams
    from guidedec.tokenizer import TokenizerInfo

PRELOAD = "guidedec.grammar.isolation_preload"
"""The fork server's preload: both backends."""
PRELOAD_DEFAULT = "guidedec.grammar.isolation_preload_default"
"""The fork server's preload for the default tokenizer: both backends and its views."""
DEFAULT_MEMORY_LIMIT = 8 << 30
"""Address space a worker may add to what it holds once started (its tokenizer's views built),
in bytes."""


@dataclass
class CompileIsolation:
    """Settings and workers of compile isolation (see the module's docstring). The workers
    serve the tokenizer of the first config they see: one isolation per tokenizer.

    Args:
        timeout_s: A probe's deadline, waiting for a worker included.
        num_workers: Probes that run at once.
        max_queued: Probes that may wait for a worker; more fail at once.
        memory_limit_bytes: Address space a worker may add to its own once started, its
            tokenizer's views built (None: no limit).
    """

    timeout_s: float = 60.0
    num_workers: int = 2
    max_queued: int = 64
    memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT
    _pool: _Pool | None = field(default=None, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.num_workers < 1 or self.max_queued < 0:
            raise ValueError(
                "compile isolation needs timeout_s > 0, num_workers >= 1 and max_queued >= 0"
            )

    def probe(
        self, backend: str, params: GuidedDecodingParams, config: GuidedDecodingConfig
    ) -> ProbeReport:
        """Compile ``params`` with ``backend`` in a worker and fill its first mask.

        Returns:
            What the worker measured: the seconds, and the heap the compiled guide held.

        Raises:
            GrammarError: the backend refused the guide, crashed on it, or passed the deadline.
        """
        with self._lock:
            if self._pool is None:
                self._pool = _Pool(self, config)
            pool = self._pool
        return pool.probe(backend, params, config)

    def start(self, config: GuidedDecodingConfig) -> None:
        """Start the fork server and one worker now (else at the first probe)."""
        with self._lock:
            if self._pool is None:
                self._pool = _Pool(self, config)
            pool = self._pool
        pool.warm()

    def start_in_background(self, config: GuidedDecodingConfig) -> threading.Thread:
        """:meth:`start` on a daemon thread (join it to wait); a failure there shows at the
        first probe."""

        def warm() -> None:
            with contextlib.suppress(Exception):
                self.start(config)

        thread = threading.Thread(target=warm, name="guidedec-isolation-start", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop the workers."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


@dataclass(frozen=True, slots=True)
class _Settings:
    tokenizer: TokenizerInfo | None  # None: the default one (built in the fork server)
    memory_limit_bytes: int | None
    parent: int


@dataclass(slots=True)
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False  # it said it is ready: it reads the pipe


class _Pool:
    def __init__(self, isolation: CompileIsolation, config: GuidedDecodingConfig) -> None:
        from guidedec.tokenizer import TokenizerInfo

        self.isolation = isolation
        default = config.tokenizer is TokenizerInfo.default()
        self.settings = _Settings(
            None if default else config.tokenizer, isolation.memory_limit_bytes, os.getpid()
        )
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload([PRELOAD_DEFAULT if default else PRELOAD])
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(isolation.num_workers)
        self._waiting = 0
        self._closed = False

    def warm(self) -> None:
        worker = self._take()
        with self._lock:
            self._idle.append(worker)

    def probe(
        self, backend: str, params: GuidedDecodingParams, config: GuidedDecodingConfig
    ) -> ProbeReport:
        timeout = self.isolation.timeout_s
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._waiting >= self.isolation.max_queued + self.isolation.num_workers:
                raise GrammarError(
                    f"too many guides compiling ({self._waiting}); try again later",
                    backend=backend,
                )
            self._waiting += 1
        try:
            if not self._slots.acquire(timeout=timeout):
                raise _timed_out(backend, timeout, "waiting for a compile worker")
            try:
                return self._run(backend, params, _options(config), deadline)
            finally:
                self._slots.release()
        finally:
            with self._lock:
                self._waiting -= 1

    def _run(
        self,
        backend: str,
        params: GuidedDecodingParams,
        options: GuidedDecodingConfig,
        deadline: float,
    ) -> ProbeReport:
        worker = self._take()
        try:
            if not worker.ready:
                self._wait_ready(worker, backend, deadline)
            # A ready worker reads its pipe, so a guide larger than the pipe's buffer cannot
            # block this send past the deadline.
            worker.conn.send((backend, params, options))
            if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                self._kill(worker)
                raise _timed_out(backend, self.isolation.timeout_s, "compiling")
            kind, message = worker.conn.recv()
        except (EOFError, OSError) as exc:
            code = self._kill(worker)
            raise GrammarError(
                f"the backend crashed compiling this guide ({_exit(code)}); only this "
                "request failed",
                backend=backend,
            ) from exc
        with self._lock:
            self._idle.append(worker)
        if kind == "error":
            raise GrammarError(message)
        seconds, held = (float(part) for part in message.split())
        # The caller compiles the guide again, in about the time the worker took: past the
        # deadline, that compile could not be stopped.
        if time.monotonic() + seconds > deadline:
            raise GrammarError(
                f"grammar compilation would pass {self.isolation.timeout_s:g} s: the guide took "
                f"{seconds:.1f} s to compile in a worker, and compiles once more here",
                backend=backend,
            )
        return ProbeReport(seconds, None if held < 0 else int(held))

    def _wait_ready(self, worker: _Worker, backend: str, deadline: float) -> None:
        """Wait for a new worker's start (its tokenizer's views built), within the deadline."""
        if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
            self._kill(worker)
            raise _timed_out(backend, self.isolation.timeout_s, "starting a compile worker")
        worker.conn.recv()
        worker.ready = True

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise GrammarError("compile isolation is closed")
            while self._idle:
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(target=_worker_main, args=(child, self.settings), daemon=True)
        with _main_script_hidden():
            process.start()
        child.close()
        return _Worker(process, parent)

    def _kill(self, worker: _Worker) -> int | None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()
        return worker.process.exitcode  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            stop_worker(worker.process, worker.conn)


@contextlib.contextmanager
def _main_script_hidden() -> Iterator[None]:
    """While a worker starts: the main module's file hidden from ``multiprocessing``, which
    would otherwise run a script's top level again in the worker (a script that builds an
    ``LLM`` without an ``if __name__ == "__main__"`` guard would start workers from there).
    The worker's code lives in this module and needs nothing from the script."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _timed_out(backend: str, timeout: float, doing: str) -> GrammarError:
    return GrammarError(
        f"grammar compilation timed out after {timeout:g} s ({doing}); the compile was stopped",
        backend=backend,
    )


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {-code}"
    return f"exit code {code}"


def _options(config: GuidedDecodingConfig) -> GuidedDecodingConfig:
    """What a worker needs of ``config``: all but the tokenizer (the worker has it) and the
    limits (checked by the caller before it probes)."""
    from guidedec.grammar.limits import UNLIMITED

    return replace(config, tokenizer=None, limits=UNLIMITED)  # type: ignore[arg-type]


def _worker_main(conn: Connection, settings: _Settings) -> None:
    """A worker's loop: probe one guide at a time until told to stop or orphaned."""
    import torch

    import guidedec.grammar.xgrammar_backend  # noqa: F401  # before the memory limit
    from guidedec.grammar.auto import build_backend_factory
    from guidedec.grammar.llguidance_backend import llguidance_tokenizer
    from guidedec.grammar.xgrammar_tokenizer import xgrammar_tokenizer_info
    from guidedec.tokenizer import TokenizerInfo

    # What every probe needs comes before the memory limit, which is the compiles' room: the
    # tokenizer and both backends' views of it (a fork server preloaded for the default
    # tokenizer has built them already).
    tokenizer = settings.tokenizer or TokenizerInfo.default()
    xgrammar_tokenizer_info(tokenizer)
    llguidance_tokenizer(tokenizer)
    factories: list[tuple[str, GuidedDecodingConfig, Any]] = []  # a few: the configs seen
    # One row in the layout of guidedec.bitmask (which the grammar layer does not import): an
    # int32 word per 32 tokens.
    bitmask = torch.zeros(1, -(-tokenizer.vocab_size // 32), dtype=torch.int32)
    if settings.memory_limit_bytes is not None:
        limit_memory(settings.memory_limit_bytes)
    lower_priority()
    conn.send(("ready", ""))
    while True:
        while not conn.poll(1.0):
            if not process_alive(settings.parent):
                return
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent closed the pipe: it is done with us
            return
        if job is None:
            return
        backend, params, options = job
        try:
            factory: Any = next((f for b, o, f in factories if b == backend and o == options), None)
            if factory is None:
                config = replace(options, tokenizer=tokenizer, compile_cache_dir=None)
                factory = build_backend_factory(backend, config)
                factories.append((backend, options, factory))
            before, start = heap_in_use(), time.monotonic()
            matcher = factory.create(params)
            seconds = time.monotonic() - start  # the compile: the caller does it again
            matcher.fill_next_token_bitmask(bitmask, 0)
            after = heap_in_use()
            held = -1 if before is None or after is None else max(0, after - before)
            del matcher
            factory.cache.clear()
            conn.send(("ok", f"{seconds:.6f} {held}"))
        except Exception as exc:  # the backend's refusal, reported to the caller as it is
            conn.send(("error", str(exc) or type(exc).__name__))


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """What a worker measured of one guide: the seconds its compile took (its first mask not
    counted), and the heap bytes the compiled guide held after its first mask (None where the C
    library cannot say)."""

    seconds: float
    heap_bytes: int | None
