"""The worker processes of ``measure_auto.py``: each evaluates one schema at a time on xgrammar,
llguidance and ``auto``, under a parent that kills a worker whose backend passes its deadline.

Workers are forked from the parent after it has built the backends' tokenizers, so a replacement
starts in milliseconds. Per worker, ``auto`` is built over the same two backend factories (and so
shares their compile caches): its compile time is the sum of the standalone compile times of the
backends it tried, in its order.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from guidedec import GuidedDecodingConfig, TokenizerInfo
from guidedec.bitmask.layout import BITMASK_DTYPE, bitmask_size
from guidedec.grammar import GrammarMatcherFactory, GuidedDecodingParams
from guidedec.grammar.auto import AutoMatcherFactory, backend_order
from guidedec.testing import accepts_output

BACKENDS = ("xgrammar", "llguidance")
ALL = (*BACKENDS, "auto")
_ERROR_CHARS = 300
# Mask times per (subset, schema index) and backend, in microseconds.
Times = dict[tuple[str, int], dict[str, "array[float]"]]


@dataclass(slots=True)
class Task:
    """One schema of one subset, with the backends already settled by the parent."""

    subset: str
    index: int
    name: str
    schema: str
    tests: list[dict[str, Any]]
    done: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class Outcome:
    """One backend on one schema."""

    compiled: bool = False
    error: str | None = None
    compile_s: float | None = None
    false_negatives: int = 0
    false_positives: int = 0
    instance_errors: list[str] = field(default_factory=list)
    covered: bool = False
    mask_us_mean: float | None = None
    mask_tokens: int = 0
    chosen: str | None = None
    order: list[str] | None = None


class Evaluator:
    """The factories of one worker process (``auto`` is built over the two backend ones)."""

    def __init__(self, tokenizer: TokenizerInfo, compile_timeout: float) -> None:
        self.tokenizer = tokenizer
        self.compile_timeout = compile_timeout
        self.auto = AutoMatcherFactory(GuidedDecodingConfig(backend="auto", tokenizer=tokenizer))
        self.factories: dict[str, GrammarMatcherFactory] = {
            name: self.auto.factory(name) for name in BACKENDS
        }
        self.factories["auto"] = self.auto
        self.bitmask = torch.zeros(1, bitmask_size(tokenizer.vocab_size), dtype=BITMASK_DTYPE)

    def clear(self) -> None:
        for name in BACKENDS:
            self.auto.factory(name).cache.clear()  # type: ignore[attr-defined]

    def compile(self, name: str, params: GuidedDecodingParams) -> Outcome:
        out = Outcome()
        start = time.perf_counter()
        try:
            self.factories[name].create(params)
        except Exception as exc:  # GrammarError, or anything a backend throws
            out.error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
        out.compile_s = time.perf_counter() - start
        if out.error is None and out.compile_s > self.compile_timeout:
            out.error = f"compile timeout ({out.compile_s:.1f} s)"
        out.compiled = out.error is None
        return out

    def check_instances(
        self, name: str, params: GuidedDecodingParams, tests: Sequence[dict[str, Any]], out: Outcome
    ) -> array[float]:
        """Fill the instance counts of ``out``; returns the mask times (us) of valid instances."""
        factory, times = self.factories[name], array("f")
        for test in tests:
            text = json.dumps(test["data"])
            try:
                accepted = accepts_output(factory, self.tokenizer, params, text)
            except Exception as exc:  # a matcher error counts as a rejection
                out.instance_errors.append(f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS])
                accepted = False
            if test["valid"] and not accepted:
                out.false_negatives += 1
            elif not test["valid"] and accepted:
                out.false_positives += 1
            elif test["valid"]:
                self.time_masks(factory, params, text, out, times)
        out.covered = out.false_negatives == 0 and out.false_positives == 0
        if times:
            out.mask_us_mean, out.mask_tokens = sum(times) / len(times), len(times)
        return times

    def time_masks(
        self,
        factory: GrammarMatcherFactory,
        params: GuidedDecodingParams,
        text: str,
        out: Outcome,
        times: array[float],
    ) -> None:
        """Append the microseconds of ``fill_next_token_bitmask`` before each token of an
        accepted valid ``text`` to ``times``. A mask that fails, or forbids the next token, makes
        the instance a false negative: decoding could not produce it."""
        matcher, here = factory.create(params), array("f")
        try:
            for token in [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]:
                start = time.perf_counter_ns()
                matcher.fill_next_token_bitmask(self.bitmask, 0)
                here.append((time.perf_counter_ns() - start) / 1000)
                if not int(self.bitmask[0, token // 32]) >> (token % 32) & 1:
                    raise ValueError(f"the mask forbids token {token} that accept_token accepts")
                matcher.accept_token(token)
        except Exception as exc:  # the matcher failed while computing a mask
            out.false_negatives += 1
            out.instance_errors.append(f"mask: {type(exc).__name__}: {exc}"[:_ERROR_CHARS])
            return
        times.extend(here)


def evaluate(ev: Evaluator, name: str, task: Task, conn: Connection) -> dict[str, Any]:
    """Compile ``task`` with backend ``name`` and check its instances; sends the result."""
    params = GuidedDecodingParams(json_schema=task.schema)
    blocked = auto_blocked(task, params) if name == "auto" else None
    times = array("f")
    if blocked is not None:
        out = Outcome(error=f"first backend tried failed: {blocked}")
    else:
        conn.send(("phase", name, "compile"))
        out = ev.compile(name, params)
    if name == "auto":
        out.order = list(backend_order(params))
        if blocked is None:
            settle_auto_compile(ev, task, params, out)
    if out.compiled:
        conn.send(("phase", name, "instances"))
        times = ev.check_instances(name, params, task.tests, out)
    result = asdict(out)
    conn.send(("result", name, result, times))
    return result


def auto_blocked(task: Task, params: GuidedDecodingParams) -> str | None:
    """Why ``auto`` would time out or crash: a backend it would try first did (else None)."""
    for name in backend_order(params):
        result = task.done[name]
        if result.get("killed") and not result["compiled"]:
            return f"{name}: {result['error']}"
        if result["compiled"]:
            return None
    return None


def settle_auto_compile(
    ev: Evaluator, task: Task, params: GuidedDecodingParams, out: Outcome
) -> None:
    """Auto's choice and compile time (the backends it tried); over the limit is a timeout."""
    assert out.order is not None
    out.chosen = ev.auto.chosen_backend(params)
    out.compile_s = auto_compile_seconds(task, out.order, out.chosen)
    if out.compiled and out.compile_s > ev.compile_timeout:
        out.compiled, out.error = False, f"compile timeout ({out.compile_s:.1f} s)"


def auto_compile_seconds(task: Task, order: list[str], chosen: str | None) -> float:
    """Sum of the standalone compile times of the backends auto tried, in its order."""
    total = 0.0
    for name in order:
        total += task.done[name]["compile_s"] or 0.0
        if name == chosen:
            break
    return total


def worker_main(conn: Connection, tokenizer: TokenizerInfo, compile_timeout: float) -> None:
    ev = Evaluator(tokenizer, compile_timeout)
    while True:
        task: Task | None = conn.recv()
        if task is None:
            return
        for name in ALL:
            if name not in task.done:
                task.done[name] = evaluate(ev, name, task, conn)
        ev.clear()
        conn.send(("done",))


# ---------------------------------------------------------------------------------------------
# Parent side: a pool of forked workers with a watchdog
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Slot:
    """One worker process and what it is doing."""

    process: Any
    conn: Connection
    task: Task | None = None
    backend: str = ""
    phase: str = ""
    deadline: float = float("inf")


class Pool:
    """Runs tasks on forked workers; kills a worker whose backend passes its deadline."""

    def __init__(self, args: argparse.Namespace, tokenizer: TokenizerInfo) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.ctx = mp.get_context("fork")
        self.slots = [self._spawn() for _ in range(args.workers)]
        self.times: Times = {}

    def _spawn(self) -> Slot:
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(
            target=worker_main,
            args=(child, self.tokenizer, self.args.compile_timeout),
            daemon=True,
        )
        process.start()
        child.close()
        return Slot(process, parent)

    def run(self, tasks: list[Task], on_done: Any) -> None:
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
                slot.conn.send(None)
                slot.process.join(timeout=5)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join()

    def _start(self, slot: Slot, task: Task) -> None:
        slot.task, slot.backend, slot.phase = task, "", ""
        slot.deadline = time.monotonic() + self.args.task_timeout
        slot.conn.send(task)

    def _poll(self, on_done: Any) -> None:
        busy = {s.conn: s for s in self.slots if s.task is not None}
        timeout = max(0.0, min(s.deadline for s in busy.values()) - time.monotonic())
        for conn in wait(list(busy), timeout=timeout):
            self._receive(busy[conn], on_done)  # type: ignore[index]
        now = time.monotonic()
        for slot in busy.values():
            if slot.task is not None and now > slot.deadline:
                self._kill(slot, f"{slot.phase} timeout (killed)")

    def _receive(self, slot: Slot, on_done: Any) -> None:
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            slot.process.join(timeout=5)
            code = slot.process.exitcode
            self._kill(slot, f"worker died in {slot.phase} (exit code {code})")
            return
        kind = message[0]
        assert slot.task is not None
        if kind == "phase":
            _, slot.backend, slot.phase = message
            limit = self.args.compile_timeout + 2 if slot.phase == "compile" else None
            limit = limit or self.args.task_timeout
            slot.deadline = time.monotonic() + limit
        elif kind == "result":
            _, name, result, times = message
            slot.task.done[name] = result
            self.times.setdefault((slot.task.subset, slot.task.index), {})[name] = times
        else:
            on_done(slot.task)
            slot.task = None

    def _kill(self, slot: Slot, reason: str) -> None:
        """Record ``reason`` against the current backend, replace the worker, resume the task."""
        task, name = slot.task, slot.backend or "xgrammar"
        assert task is not None
        task.done[name] = {**asdict(Outcome(error=reason)), "killed": True}
        if slot.phase == "instances":
            task.done[name]["compiled"] = True
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join()
        fresh = self._spawn()
        slot.process, slot.conn = fresh.process, fresh.conn
        self._start(slot, task)
