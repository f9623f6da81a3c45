"""The worker processes of ``guidedec bench compliance``: each evaluates one schema at a time on
the chosen backends, under a parent that kills a worker whose backend passes its deadline or
dies, records that against the backend, and goes on with the schema in a fresh worker.

Workers are forked from a fork server that has built the backends' tokenizers
(:mod:`guidedec.grammar.isolation_preload_default`), so a replacement starts in milliseconds. Per
worker, ``auto`` is built over the same two backend factories (and so shares their compile
caches): when both
backends ran first, its compile time is the sum of the standalone compile times of the backends
it tried, in its order.
"""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from guidedec import TokenizerInfo
from guidedec.bench.compliance_evaluator import (
    BACKENDS,
    Evaluator,
    Outcome,
    note_error,
    short_error,
)
from guidedec.grammar import GuidedDecodingParams
from guidedec.grammar.auto import backend_order
from guidedec.grammar.host import process_alive

ALL = (*BACKENDS, "auto")
# Test hook: a worker evaluating the schema named NAME (on BACKEND, else on any) exits at once.
CRASH_ENV = "GUIDEDEC_BENCH_CRASH"  # "NAME" or "NAME@BACKEND"


@dataclass(slots=True)
class Task:
    """One schema of one subset, with the backends already settled by the parent."""

    subset: str
    index: int
    name: str
    schema: Any
    tests: list[dict[str, Any]]
    backends: tuple[str, ...]
    done: dict[str, dict[str, Any]] = field(default_factory=dict)


def _crash_hook(task: Task, name: str, target: str | None) -> None:
    if target and target in (task.name, f"{task.name}@{name}"):
        os._exit(1)


def evaluate(ev: Evaluator, name: str, task: Task, conn: Connection) -> dict[str, Any]:
    """Compile ``task`` with backend ``name``, check its instances and generate; sends the
    result (and a partial one before generation, kept if generation is killed)."""
    conn.send(("phase", name, "setup"))
    _crash_hook(task, name, ev.crash)
    params = GuidedDecodingParams(json_schema=json.dumps(task.schema))
    blocked = auto_blocked(task, params) if name == "auto" else None
    times: array[float] = array("f")
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
        ev.check_instances(name, params, task.tests, out, times)
        conn.send(("partial", name, asdict(out)))
        conn.send(("phase", name, "generate"))
        try:
            ev.generate(name, params, task.schema, out, times)
        except Exception as exc:  # the decoder or a matcher failed: no outputs to judge
            note_error(out.gen_errors, short_error(exc, "generate: "))
        if ev.model is not None:
            conn.send(("partial", name, asdict(out)))
            conn.send(("phase", name, "model"))
            try:
                ev.generate_with_model(name, params, task.schema, out)
            except Exception as exc:  # the engine failed: no outputs to judge
                note_error(out.model_errors, short_error(exc, "model: "))
    if times:
        out.mask_fills, out.mask_us_mean = len(times), sum(times) / len(times)
    result = asdict(out)
    conn.send(("result", name, result, times))
    return result


def auto_blocked(task: Task, params: GuidedDecodingParams) -> str | None:
    """Why ``auto`` would hang or crash: a backend it would try first did (else None)."""
    for name in backend_order(params):
        result = task.done.get(name)
        if result is None:
            return None
        if result.get("killed") and not result["compiled"]:
            return f"{name}: {result['error']}"
        if result["compiled"]:
            return None
    return None


def settle_auto_compile(
    ev: Evaluator, task: Task, params: GuidedDecodingParams, out: Outcome
) -> None:
    """Auto's choice and compile time (the sum of the backends it tried when they ran first:
    they share its cache); over the limit is a timeout."""
    assert out.order is not None
    out.chosen = ev.auto.chosen_backend(params)
    total, tried = 0.0, []
    for name in out.order:
        tried.append(name)
        if name == out.chosen:
            break
    if all(name in task.done for name in tried):
        total = sum(task.done[name]["compile_s"] or 0.0 for name in tried)
        out.compile_s = total
    if out.compiled and out.compile_s is not None and out.compile_s > ev.compile_timeout:
        out.compiled, out.error = False, f"compile timeout ({out.compile_s:.1f} s)"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What every worker is started with."""

    compile_timeout: float
    parent: int  # the benchmark's process: a worker leaves when it is gone
    log: Path | None = None  # where the backends' own warnings go
    model: str | None = None  # --model
    crash: str | None = None  # the CRASH_ENV test hook, read by the parent
    approximate: bool = True  # auto's GuidedDecodingConfig.approximate


def worker_main(conn: Connection, settings: WorkerSettings) -> None:
    """A worker's loop: one task at a time until told to stop or orphaned. It uses the default
    tokenizer, which the fork server built before forking it."""
    if settings.log is not None:  # the backends' native warnings would garble the progress bar
        fd = os.open(settings.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    ev = Evaluator(
        TokenizerInfo.default(), settings.compile_timeout, settings.model, settings.approximate
    )
    ev.crash = settings.crash
    while True:
        # Siblings may hold this pipe's other end too, so a dead parent need not close it:
        # poll, and leave once the parent is gone.
        while not conn.poll(1.0):
            if not process_alive(settings.parent):
                return
        task: Task | None = conn.recv()
        if task is None:
            return
        for name in task.backends:
            if name not in task.done:
                task.done[name] = evaluate(ev, name, task, conn)
        ev.clear()
        conn.send(("done",))
