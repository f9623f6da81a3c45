"""One worker's evaluation of a schema on a backend for ``guidedec bench compliance``: compile,
the schema's test instances, random-logits generation with the engine's checks and without,
and, with ``--model``, a real model's outputs."""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from guidedec import GuidedDecoder, GuidedDecodingConfig, TokenizerInfo
from guidedec.bitmask.layout import BITMASK_DTYPE, bitmask_size
from guidedec.engine.validation import OutputValidator, schema_validator
from guidedec.grammar import GrammarMatcher, GrammarMatcherFactory, GuidedDecodingParams
from guidedec.grammar.auto import AutoMatcherFactory
from guidedec.grammar.matcher import WrappedFactory, WrappedMatcher
from guidedec.testing import EngineChecks, accepts_output, uniform_guided_generate

BACKENDS = ("xgrammar", "llguidance")
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


def short_error(exc: BaseException, prefix: str = "") -> str:
    return f"{prefix}{type(exc).__name__}: {exc}"[:_ERROR_CHARS]


def note_error(errors: list[str], message: str) -> None:
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
            out.error = short_error(exc)
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
                    note_error(out.instance_errors, f"valid rejected: {why}")
                continue
            out.invalid_tests += 1
            try:
                accepted = accepts_output(factory, self.tokenizer, params, text)
            except Exception as exc:  # a matcher error counts as a rejection
                note_error(out.instance_errors, short_error(exc, "invalid: "))
                accepted = False
            if accepted:
                out.false_positives += 1
                note_error(out.instance_errors, f"invalid accepted: {text[:80]}")
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
            return short_error(exc)
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
                note_error(out.gen_errors, f"decoder: {output.error}")
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
                note_error(out.model_errors, f"engine: {output.error}")
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
        note_error(errors, verdict)
        return "unchecked"
    note_error(errors, f"{verdict}: {text[:80]}")
    return "invalid"


def _validator_or_note(schema: Any, errors: list[str]) -> Any:
    try:
        return schema_validator(schema)
    except Exception as exc:  # not a schema jsonschema can read
        note_error(errors, short_error(exc, "validator: "))
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
        return short_error(exc, "unchecked: ")
    return None if error is None else f"invalid: {error.message}"
