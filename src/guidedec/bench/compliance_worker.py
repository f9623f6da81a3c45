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
import multiprocessing as mp
import os
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from guidedec import GuidedDecoder, GuidedDecodingConfig, TokenizerInfo
from guidedec.bitmask.layout import BITMASK_DTYPE, bitmask_size
from guidedec.engine.validation import OutputValidator, schema_validator
from guidedec.grammar import GrammarMatcher, GrammarMatcherFactory, GuidedDecodingParams
from guidedec.grammar.auto import AutoMatcherFactory, backend_order
from guidedec.grammar.host import process_alive, stop_worker
from guidedec.grammar.isolation import PRELOAD_DEFAULT
from guidedec.grammar.matcher import WrappedFactory, WrappedMatcher
from guidedec.testing import EngineChecks, accepts_output, uniform_guided_generate

BACKENDS = ("xgrammar", "llguidance")
ALL = (*BACKENDS, "auto")
# Test hook: a worker evaluating the schema named NAME (on BACKEND, else on any) exits at once.
CRASH_ENV = "GUIDEDEC_BENCH_CRASH"  # "NAME" or "NAME@BACKEND"
GEN_SAMPLES = 16  # random-logits outputs per schema and backend
GEN_MAX_TOKENS = 48  # outputs that terminate mostly do so within ~30 tokens
GEN_SEED = 0
MODEL_SAMPLES = 2  # with --model: one greedy and one sampled output per schema and backend
MODEL_MAX_TOKENS = 96
MODEL_PROMPT = "Write one JSON value that follows this JSON schema.\nSchema: {schema}\nJSON: "
_ERROR_CHARS = 300
# What the engine's checks say of an output they end (see guidedec.engine.validation).
_SCHEMA_ERRORS = ("the output breaks its schema", "the output is not")
_MAX_ERRORS = 5


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


@dataclass(slots=True)
class Outcome:
    """One backend on one schema."""

    compiled: bool = False
    error: str | None = None
    compile_s: float | None = None
    killed: str | None = None  # "crash" or "hang": the worker died or passed its deadline
    valid_tests: int = 0
    invalid_tests: int = 0
    false_negatives: int = 0
    false_positives: int = 0
    instance_errors: list[str] = field(default_factory=list)
    covered: bool = False
    mask_fills: int = 0
    mask_us_mean: float | None = None
    gen_outputs: int = 0
    gen_terminated: int = 0
    gen_valid: int = 0
    gen_unchecked: int = 0
    gen_errors: list[str] = field(default_factory=list)
    gen_caught: int = 0  # ended by the engine's checks: the output broke its schema
    gen_steered: int = 0  # sampled tokens drawn again by steering
    gen_forced: int = 0  # rows budget-aware closing restricted to its witness
    gen_s: float = 0.0  # the generation with the checks
    gen_plain_s: float = 0.0  # the same generation without them
    gen_plain_invalid: int = 0  # without them: outputs that stopped and broke their schema
    gen_plain_tokens: int = 0
    gen_tokens: int = 0
    model_outputs: int = 0
    model_terminated: int = 0
    model_valid: int = 0
    model_unchecked: int = 0
    model_errors: list[str] = field(default_factory=list)
    chosen: str | None = None
    order: list[str] | None = None


def _short(exc: BaseException, prefix: str = "") -> str:
    return f"{prefix}{type(exc).__name__}: {exc}"[:_ERROR_CHARS]


def _note(errors: list[str], message: str) -> None:
    if len(errors) < _MAX_ERRORS:
        errors.append(message[:_ERROR_CHARS])


class TimingMatcher(WrappedMatcher):
    """A matcher that appends the microseconds of each mask fill to ``times``."""

    def __init__(self, inner: GrammarMatcher, times: Callable[[], array[float]]) -> None:
        super().__init__(inner)
        self.times = times

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        start = time.perf_counter_ns()
        self.inner.fill_next_token_bitmask(bitmask, index)
        self.times().append((time.perf_counter_ns() - start) / 1000)


class TimingFactory(WrappedFactory):
    """Hands out :class:`TimingMatcher` s over ``inner``'s matchers; set ``times`` per use."""

    def __init__(self, inner: GrammarMatcherFactory) -> None:
        super().__init__(inner)
        self.times: array[float] = array("f")

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        return TimingMatcher(self.inner.create(params), lambda: self.times)


class Evaluator:
    """The factories of one worker process (``auto`` is built over the two backend ones)."""

    def __init__(
        self,
        tokenizer: TokenizerInfo,
        compile_timeout: float,
        model: str | None = None,
        approximate: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.compile_timeout = compile_timeout
        self.model = model
        self.engines: dict[str, Any] = {}  # backend -> guidedec.LLM, built on first use
        self.crash: str | None = None  # the CRASH_ENV test hook
        config = GuidedDecodingConfig(backend="auto", tokenizer=tokenizer, approximate=approximate)
        self.auto = AutoMatcherFactory(config)
        self.factories: dict[str, GrammarMatcherFactory] = {
            name: self.auto.factory(name) for name in BACKENDS
        }
        self.factories["auto"] = self.auto
        self.bitmask = torch.zeros(1, bitmask_size(tokenizer.vocab_size), dtype=BITMASK_DTYPE)
        self.decoders: dict[str, tuple[GuidedDecoder, TimingFactory]] = {}
        self.output_validator = OutputValidator()

    def clear(self) -> None:
        for name in BACKENDS:
            self.auto.factory(name).cache.clear()  # type: ignore[attr-defined]

    def compile(self, name: str, params: GuidedDecodingParams) -> Outcome:
        out = Outcome()
        start = time.perf_counter()
        try:
            self.factories[name].create(params)
        except Exception as exc:  # GrammarError, or anything a backend throws
            out.error = _short(exc)
        out.compile_s = time.perf_counter() - start
        if out.error is None and out.compile_s > self.compile_timeout:
            out.error = f"compile timeout ({out.compile_s:.1f} s)"
        out.compiled = out.error is None
        return out

    def check_instances(
        self,
        name: str,
        params: GuidedDecodingParams,
        tests: Sequence[dict[str, Any]],
        out: Outcome,
        times: array[float],
    ) -> None:
        """Count false negatives (a valid instance that the masks or the matcher refuse) and
        false positives (an invalid instance accepted, stop token included)."""
        factory = self.factories[name]
        for test in tests:
            text = json.dumps(test["data"])
            if test["valid"]:
                out.valid_tests += 1
                why = self.walk_valid(factory, params, text, times)
                if why is not None:
                    out.false_negatives += 1
                    _note(out.instance_errors, f"valid rejected: {why}")
                continue
            out.invalid_tests += 1
            try:
                accepted = accepts_output(factory, self.tokenizer, params, text)
            except Exception as exc:  # a matcher error counts as a rejection
                _note(out.instance_errors, _short(exc, "invalid: "))
                accepted = False
            if accepted:
                out.false_positives += 1
                _note(out.instance_errors, f"invalid accepted: {text[:80]}")
        out.covered = out.false_negatives == 0 and out.false_positives == 0

    def walk_valid(
        self,
        factory: GrammarMatcherFactory,
        params: GuidedDecodingParams,
        text: str,
        times: array[float],
    ) -> str | None:
        """Feed ``text`` and a stop token, filling a mask before each token (timed); None when
        every token is allowed by its mask and accepted, else why not."""
        try:
            matcher = factory.create(params)
            for token in [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]:
                start = time.perf_counter_ns()
                matcher.fill_next_token_bitmask(self.bitmask, 0)
                times.append((time.perf_counter_ns() - start) / 1000)
                if not int(self.bitmask[0, token // 32]) >> (token % 32) & 1:
                    also = "accepts" if matcher.accept_token(token) else "rejects"
                    return f"the mask forbids token {token} (accept_token {also} it)"
                if not matcher.accept_token(token):
                    return f"accept_token rejects token {token}"
        except Exception as exc:  # the matcher failed
            return _short(exc)
        return None

    def generate(
        self, name: str, params: GuidedDecodingParams, schema: Any, out: Outcome, times: Any
    ) -> None:
        """Random-logits guided generation (sampled uniformly from the masks: the same
        distribution); terminated outputs are validated with jsonschema."""
        if name not in self.decoders:
            timing = TimingFactory(self.factories[name])
            config = GuidedDecodingConfig(backend=name, tokenizer=self.tokenizer)  # type: ignore[arg-type]
            decoder = GuidedDecoder(config=config, factory=timing, max_num_sequences=GEN_SAMPLES)
            decoder.warm_up()  # built once per worker, not within a schema's timing
            timing.warm_up()  # so is what the backends' completes read
            self.decoders[name] = (decoder, timing)
        decoder, timing = self.decoders[name]
        timing.times = times
        validator = _validator_or_note(schema, out.gen_errors)
        # First without the engine's checks and the decoder's root types (the backend alone:
        # timing and what would stop invalid), then with them (the defaults: the figures of
        # the main table).
        decoder.rules.root_types = False
        start = time.perf_counter()
        plain = uniform_guided_generate(
            decoder, [params] * GEN_SAMPLES, seed=GEN_SEED, max_tokens=GEN_MAX_TOKENS
        )
        out.gen_plain_s = time.perf_counter() - start
        decoder.rules.root_types = True
        for output in plain:
            verdict = validate(validator, self.tokenizer.decode(output.token_ids))
            invalid = verdict is not None and not verdict.startswith("unchecked")
            out.gen_plain_invalid += output.finished and invalid
        # Mask times come from the first run: closing's searches fill masks of other states.
        timing.times = array("f")
        checks = EngineChecks(validator=self.output_validator)
        closing = decoder.closer.stats
        forced, start = closing.forced_rows, time.perf_counter()
        outputs = uniform_guided_generate(
            decoder, [params] * GEN_SAMPLES, seed=GEN_SEED, max_tokens=GEN_MAX_TOKENS, checks=checks
        )
        out.gen_s = time.perf_counter() - start
        assert checks.steering is not None
        out.gen_steered = checks.steering.stats.steered
        out.gen_forced = closing.forced_rows - forced
        out.gen_tokens = sum(len(output.token_ids) + output.finished for output in outputs)
        out.gen_plain_tokens = sum(len(output.token_ids) + output.finished for output in plain)
        out.gen_outputs = len(outputs)
        for output in outputs:
            if output.error is not None:
                _note(out.gen_errors, f"decoder: {output.error}")
                out.gen_caught += output.error.startswith(_SCHEMA_ERRORS)
            if not output.finished:
                continue
            out.gen_terminated += 1
            verdict = judge(validator, self.tokenizer.decode(output.token_ids), out.gen_errors)
            out.gen_valid += verdict == "valid"
            out.gen_unchecked += verdict == "unchecked"

    def generate_with_model(
        self, name: str, params: GuidedDecodingParams, schema: Any, out: Outcome
    ) -> None:
        """The reference engine with ``--model``: a greedy and a sampled output, prompted with
        the schema; those that stop must validate with jsonschema."""
        from guidedec import LLM, SamplingParams

        if name not in self.engines:
            self.engines[name] = LLM(
                self.model or "tiny-random",
                backend=name,  # type: ignore[arg-type]
                max_num_seqs=MODEL_SAMPLES,
                compile_timeout_s=self.compile_timeout,
                isolate_compiles=False,  # this worker is the isolation
            )
        prompt = MODEL_PROMPT.format(schema=json.dumps(schema)[:2000])
        sampling = [
            SamplingParams(
                max_tokens=MODEL_MAX_TOKENS,
                temperature=0.0 if i == 0 else 1.0,
                seed=GEN_SEED + i,
                guided_decoding=params,
            )
            for i in range(MODEL_SAMPLES)
        ]
        validator = _validator_or_note(schema, out.model_errors)
        for output in self.engines[name].generate([prompt] * MODEL_SAMPLES, sampling):
            out.model_outputs += 1
            if output.error is not None:
                _note(out.model_errors, f"engine: {output.error}")
            if output.finish_reason != "stop":
                continue
            out.model_terminated += 1
            verdict = judge(validator, output.text, out.model_errors)
            out.model_valid += verdict == "valid"
            out.model_unchecked += verdict == "unchecked"


def judge(validator: Any, text: str, errors: list[str]) -> str:
    """``"valid"``, ``"unchecked"`` (the validator could not judge) or ``"invalid"`` for one
    terminated output; notes why in ``errors`` when it is not valid."""
    verdict = validate(validator, text)
    if verdict is None:
        return "valid"
    if verdict.startswith("unchecked"):
        _note(errors, verdict)
        return "unchecked"
    _note(errors, f"{verdict}: {text[:80]}")
    return "invalid"


def _validator_or_note(schema: Any, errors: list[str]) -> Any:
    try:
        return schema_validator(schema)
    except Exception as exc:  # not a schema jsonschema can read
        _note(errors, _short(exc, "validator: "))
        return None


def validate(validator: Any, text: str) -> str | None:
    """None if ``text`` is valid JSON under ``validator``; else why ("unchecked: ..." when the
    validator could not judge)."""
    if validator is None:
        return "unchecked: no validator"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}"
    try:
        error = next(iter(validator.iter_errors(value)), None)
    except Exception as exc:  # unresolvable refs, regexes Python cannot read, ...
        return _short(exc, "unchecked: ")
    return None if error is None else f"invalid: {error.message}"


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
            _note(out.gen_errors, _short(exc, "generate: "))
        if ev.model is not None:
            conn.send(("partial", name, asdict(out)))
            conn.send(("phase", name, "model"))
            try:
                ev.generate_with_model(name, params, task.schema, out)
            except Exception as exc:  # the engine failed: no outputs to judge
                _note(out.model_errors, _short(exc, "model: "))
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


# ---------------------------------------------------------------------------------------------
# Parent side: a pool of workers with a watchdog
# ---------------------------------------------------------------------------------------------

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
