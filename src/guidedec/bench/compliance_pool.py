"""The parent side of ``guidedec bench compliance``: a pool of worker processes
(:mod:`guidedec.bench.compliance_worker`) with a watchdog that kills a worker whose backend
passes its deadline or dies, records that against the backend, and goes on in a fresh worker."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from guidedec.bench.compliance_evaluator import Outcome
from guidedec.bench.compliance_worker import CRASH_ENV, Task, WorkerSettings, worker_main
from guidedec.grammar.host import stop_worker
from guidedec.grammar.isolation import PRELOAD_DEFAULT

# Mask times per (subset, schema index) and backend, in microseconds.
Times = dict[tuple[str, int], dict[str, "array[float]"]]


@dataclass(slots=True)
class Slot:
    """One worker process and what it is doing."""

    process: Any
    conn: Connection
    task: Task | None = None
    backend: str = ""
    phase: str = ""
    partial: dict[str, Any] | None = None
    deadline: float = float("inf")


class Pool:
    """Runs tasks on worker processes; kills a worker whose backend passes its deadline.

    Workers are forked from a fork server (a fresh, single-threaded process that has built the
    default tokenizer for both backends), not from this process: forking a process whose other
    threads hold locks (an engine's, a compiler's, torch's) can leave the child waiting forever.
    A replacement worker still starts in milliseconds.
    """

    def __init__(
        self,
        workers: int,
        compile_timeout: float,
        phase_timeout: float,
        *,
        log: Path | None = None,
        model: str | None = None,
        approximate: bool = True,
    ) -> None:
        self.settings = WorkerSettings(
            compile_timeout, os.getpid(), log, model, os.environ.get(CRASH_ENV), approximate
        )
        self.compile_timeout = compile_timeout
        self.phase_timeout = phase_timeout
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload([PRELOAD_DEFAULT])
        self.slots = [self._spawn() for _ in range(workers)]
        self.times: Times = {}

    def _spawn(self) -> Slot:
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(target=worker_main, args=(child, self.settings), daemon=True)
        process.start()
        child.close()
        return Slot(process, parent)

    def run(self, tasks: Sequence[Task], on_done: Callable[[Task], None]) -> None:
        queue = list(reversed(tasks))
        while queue or any(s.task for s in self.slots):
            for slot in self.slots:
                if slot.task is None and queue:
                    self._start(slot, queue.pop())
            self._poll(on_done)

    def close(self) -> None:
        """Stop the workers (killing any still busy)."""
        for slot in self.slots:
            if slot.task is None:
                stop_worker(slot.process, slot.conn, 5.0)
            else:  # busy: killed now
                stop_worker(slot.process, None, 0.0)

    def _start(self, slot: Slot, task: Task) -> None:
        slot.task, slot.backend, slot.phase, slot.partial = task, "", "", None
        slot.deadline = time.monotonic() + self.phase_timeout
        slot.conn.send(task)

    def _poll(self, on_done: Callable[[Task], None]) -> None:
        busy = {s.conn: s for s in self.slots if s.task is not None}
        timeout = max(0.0, min(s.deadline for s in busy.values()) - time.monotonic())
        for conn in wait(list(busy), timeout=timeout):
            self._receive(busy[conn], on_done)  # type: ignore[index]
        now = time.monotonic()
        for slot in busy.values():
            if slot.task is not None and now > slot.deadline:
                self._kill(slot, "hang", f"{slot.phase} timeout (killed)")

    def _receive(self, slot: Slot, on_done: Callable[[Task], None]) -> None:
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            slot.process.join(timeout=5)
            code = slot.process.exitcode
            self._kill(slot, "crash", f"worker died in {slot.phase or 'setup'} (exit code {code})")
            return
        kind = message[0]
        assert slot.task is not None
        if kind == "phase":
            _, slot.backend, slot.phase = message
            limit = self.compile_timeout + 2 if slot.phase == "compile" else self.phase_timeout
            slot.deadline = time.monotonic() + limit
        elif kind == "partial":
            slot.partial = message[2]
        elif kind == "result":
            _, name, result, times = message
            slot.task.done[name] = result
            slot.backend, slot.phase, slot.partial = "", "", None
            self.times.setdefault((slot.task.subset, slot.task.index), {})[name] = times
        else:
            on_done(slot.task)
            slot.task = None

    def _kill(self, slot: Slot, kind: str, reason: str) -> None:
        """Record ``reason`` against the current backend, replace the worker, resume the task."""
        task = slot.task
        assert task is not None
        # Empty when it died between backends: the fresh worker just finishes the task.
        name = slot.backend or next((n for n in task.backends if n not in task.done), "")
        if name and slot.phase in ("generate", "model") and slot.partial is not None:
            task.done[name] = {**slot.partial, "killed": kind}
            task.done[name]["gen_errors"] = [*slot.partial["gen_errors"], reason]
        elif name:
            task.done[name] = {**asdict(Outcome(error=reason)), "killed": kind}
            task.done[name]["compiled"] = slot.phase in ("instances", "generate")
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join()
        fresh = self._spawn()
        slot.process, slot.conn = fresh.process, fresh.conn
        self._start(slot, task)
