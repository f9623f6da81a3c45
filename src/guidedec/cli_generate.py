"""``guidedec generate``: load the guide, run the prompts through ``LLM``, print the outputs.

Plain mode prints ``[i] finish_reason: text`` per prompt (plus the error of a ``grammar_error``
and, for a JSON schema guide, whether the output validates); ``--jsonl`` prints one JSON object
per prompt. A summary line (and, for long runs, a progress bar) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from tqdm import tqdm  # type: ignore[import-untyped]

from guidedec import LLM, GuidedDecodingParams, RequestOutput, SamplingParams
from guidedec.engine.chat import load_chat_template, render_chat

PROGRESS_MIN_PROMPTS = 5  # a progress bar for this many prompts, or whenever stderr is a TTY


class CliError(Exception):
    """A user-facing error: printed on stderr without a traceback, exit status 1."""


@dataclass(frozen=True)
class Guide:
    """The run's guide (None: unguided) and, for a JSON schema, the schema to validate against."""

    params: GuidedDecodingParams | None
    schema: dict[str, Any] | None = None


@dataclass
class RunResult:
    outputs: list[RequestOutput]
    elapsed_s: float  # from the first request queued to the last one finished
    step_s: float  # inside ``LLM.step``


# --- the guide -------------------------------------------------------------------------------


def load_guide(args: argparse.Namespace) -> Guide:
    """The guide the options ask for; CliError when a file cannot be read or parsed, or
    ``--think-first`` goes with another guide."""
    think = bool(getattr(args, "think_first", False))
    if think and args.json_schema is None and not args.json:
        raise CliError("--think-first goes with --json-schema or --json")
    if args.json_schema is not None:
        schema = load_schema(args.json_schema)
        try:
            return Guide(GuidedDecodingParams(json_schema=schema, think_first=think), schema)
        except ValueError as exc:
            raise CliError(f"--think-first: {exc}") from exc
    if think:
        return Guide(GuidedDecodingParams(json_object=True, think_first=True))
    if args.structural_tag is not None:
        text = read_text(args.structural_tag, "structural tag")
        tag = _json_object(text, f"structural tag file {args.structural_tag}")
        return Guide(GuidedDecodingParams(structural_tag=tag))
    fields: dict[str, Any] = {
        "json_object": args.json or None,
        "regex": args.regex,
        "ebnf": args.ebnf and read_text(args.ebnf, "EBNF grammar"),
        "lark": args.lark and read_text(args.lark, "Lark grammar"),
        "choice": args.choice,
    }
    chosen = {name: value for name, value in fields.items() if value is not None}
    return Guide(GuidedDecodingParams(**chosen) if chosen else None)


def load_schema(value: str) -> dict[str, Any]:
    """A JSON schema given inline (text starting with ``{``) or as a file path, checked against
    its metaschema."""
    inline = value.lstrip().startswith("{")
    source = "the inline JSON schema" if inline else f"JSON schema file {value}"
    schema = _json_object(value if inline else read_text(value, "JSON schema"), source)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "".join(f"[{part!r}]" for part in exc.path)
        msg = f"{source} is not a valid JSON schema: {exc.message} at {path or 'the root'}"
        raise CliError(msg) from exc
    return schema


def read_text(path: str, what: str) -> str:
    """The UTF-8 text of ``path``; CliError naming the path when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CliError(f"{what} file not found: {path}") from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"{what} file {path} is not UTF-8 text: {exc.reason}") from exc
    except OSError as exc:
        raise CliError(f"cannot read {what} file {path}: {exc.strerror or exc}") from exc


def _json_object(text: str, source: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise CliError(f"{source} must hold a JSON object, not {type(value).__name__}")
    return value


# --- the run ---------------------------------------------------------------------------------


RANDOM_MODELS = ("tiny-random", "tiny-random-draft")
RANDOM_NOTE = (
    "guidedec: note: {model} has random weights (a test model, no download): its text is "
    "nonsense, but it follows the guide"
)
GRAMMAR_ERROR_STATUS = 3
"""Exit status of ``generate`` when an output ended in ``grammar_error``."""


def build_llm(args: argparse.Namespace) -> LLM:
    try:
        return LLM(
            args.model,
            backend=args.backend,
            max_num_seqs=args.max_num_seqs,
            speculative=args.speculative,
            num_draft_tokens=args.num_draft_tokens,
            json_whitespace=args.whitespace,
            disable_additional_properties=getattr(args, "disable_additional_properties", True),
            overlap=getattr(args, "overlap", True),
            approximate=getattr(args, "approximate", True),
            cuda_graphs=getattr(args, "cuda_graphs", False),
            fill_mode=getattr(args, "fill_mode", "auto"),
            max_model_len=getattr(args, "max_model_len", None),
            mask_time_limit_ms=_mask_time_limit(getattr(args, "mask_time_limit_ms", 20.0)),
            compile_cache_dir=getattr(args, "compile_cache_dir", None),
            jump_forward=getattr(args, "jump_forward", None),
            reasoning_parser=getattr(args, "reasoning_parser", None),
        )
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot start the engine with model {args.model!r}: {exc}") from exc


def _mask_time_limit(value: float) -> float | None:
    return None if value == 0 else value


def sampling_params(args: argparse.Namespace, guide: Guide) -> list[SamplingParams]:
    """One SamplingParams per prompt; prompt i gets seed ``args.seed + i`` when seeded."""
    return [
        SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=None if args.seed is None else args.seed + i,
            stop=getattr(args, "stop", None),
            thinking_token_budget=getattr(args, "thinking_token_budget", None),
            guided_decoding=guide.params,
            close_within_budget=getattr(args, "close_within_budget", True),
        )
        for i in range(len(args.prompts))
    ]


def chat_template(args: argparse.Namespace) -> str | None:
    """``--chat-template``'s template, None when not given.

    Raises:
        CliError: neither a file nor a template.
    """
    if not args.chat_template:
        return None
    try:
        return load_chat_template(args.chat_template)
    except ValueError as exc:
        raise CliError(f"--chat-template: {exc}") from exc


def chat_prompts(llm: LLM, args: argparse.Namespace) -> list[str]:
    """Each prompt as a user message (after ``--system``), through the model's chat template
    (:func:`guidedec.engine.chat.render_chat`, as ``LLM.chat`` and the server render)."""
    system = [{"role": "system", "content": args.system}] if args.system else []
    hf = llm.tokenizer.hf_tokenizer
    template = chat_template(args)
    return [
        render_chat([*system, {"role": "user", "content": p}], hf, chat_template=template)
        for p in args.prompts
    ]


def run(llm: LLM, prompts: list[str], params: list[SamplingParams], progress: bool) -> RunResult:
    """Queue every prompt, step until all finish; outputs in prompt order."""
    start = time.perf_counter()
    ids = [
        _add(llm, i, prompt, p) for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
    ]
    total = sum(p.max_tokens for p in params)
    with tqdm(total=total, disable=not progress, file=sys.stderr, unit="tok") as bar:
        budgets = {i: p.max_tokens for i, p in zip(ids, params, strict=True)}
        done, step_s = _step_until_done(llm, budgets, bar)
    return RunResult([done[i] for i in ids], time.perf_counter() - start, step_s)


def _step_until_done(
    llm: LLM, budgets: dict[int, int], bar: Any
) -> tuple[dict[int, RequestOutput], float]:
    """Step until every request finished: their outputs by id, and the seconds in steps. The
    bar counts tokens: each step's, and at a request's end the budget it left unused."""
    done: dict[int, RequestOutput] = {}
    step_s, generated = 0.0, llm.stats.generated_tokens
    while len(done) < len(budgets):
        step_start = time.perf_counter()
        finished = llm.step()
        step_s += time.perf_counter() - step_start
        done.update((out.request_id, out) for out in finished)
        now = llm.stats.generated_tokens
        unused = sum(budgets.get(out.request_id, 0) - len(out.token_ids) for out in finished)
        bar.update(now - generated + max(0, unused))
        generated = now
    return done, step_s


def _add(llm: LLM, index: int, prompt: str, params: SamplingParams) -> int:
    try:
        return llm.add_request(prompt, params)
    except ValueError as exc:
        raise CliError(f"prompt {index} ({prompt[:40]!r}) was rejected: {exc}") from exc


def show_progress(num_prompts: int) -> bool:
    return sys.stderr.isatty() or num_prompts >= PROGRESS_MIN_PROMPTS


# --- the output ------------------------------------------------------------------------------


def print_plain(outputs: list[RequestOutput], schema: dict[str, Any] | None) -> None:
    for i, out in enumerate(outputs):
        if out.reasoning is not None:
            print(f"[{i}] reasoning: {out.reasoning}")
        print(f"[{i}] {out.finish_reason}: {out.text}")
        if out.error is not None:
            print(f"    error: {out.error}")
        elif out.incomplete is not None:
            print(f"    incomplete: {out.incomplete}")
        else:
            if out.closed_from is not None:
                forced = out.text[out.closed_from :]
                print(
                    f"    closed: the budget wrote the rest from character {out.closed_from}:"
                    f" {forced!r}"
                )
            if schema is not None:
                print(f"    schema: {schema_status(out.text, schema, out.complete)}")


def print_jsonl(outputs: list[RequestOutput]) -> None:
    for out in outputs:
        record = {
            "prompt": out.prompt,
            "text": out.text,
            **({} if out.reasoning is None else {"reasoning": out.reasoning}),
            "token_ids": out.token_ids,
            "finish_reason": out.finish_reason,
            "error": out.error,
            "incomplete": out.incomplete,
            "closed_from": out.closed_from,
            "timings": timings(out),
        }
        print(json.dumps(record, ensure_ascii=False))


def timings(out: RequestOutput) -> dict[str, float | None]:
    """Seconds from the request's arrival to its first token and to its end (None if never)."""
    m = out.metrics
    ttft = None if m.first_token is None else round(m.first_token - m.arrival, 6)
    e2e = None if m.finished is None else round(m.finished - m.arrival, 6)
    return {"ttft_s": ttft, "e2e_s": e2e}


def schema_status(text: str, schema: dict[str, Any], finished: bool) -> str:
    """``"valid"``, ``"INVALID: why"``, or ``"unfinished ..."`` when the output was cut off."""
    if not finished:
        return "unfinished (max tokens reached)"
    try:
        jsonschema.validate(json.loads(text), schema)
    except json.JSONDecodeError as exc:
        return f"INVALID: not JSON: {exc}"
    except jsonschema.ValidationError as exc:
        return f"INVALID: {exc.message} (at {exc.json_path})"
    return "valid"


def summary(llm: LLM, result: RunResult) -> str:
    """One line: prompts, tokens, tokens/s, guided overhead, finish reasons, draft acceptance."""
    reasons = Counter(out.finish_reason for out in result.outputs)
    parts = [
        _throughput(result),
        _guided_overhead(llm.stats.guide_s, result.step_s),
        _mask_times(llm),
        "finish: " + ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items())),
    ]
    if llm.num_draft_tokens:
        parts.append(_acceptance(llm.stats.accepted_draft_tokens, llm.stats.draft_tokens))
    stats = llm.stats
    if stats.forced_draft_tokens:
        parts.append(
            f"jump-forward: {stats.accepted_forced_tokens} of {stats.forced_draft_tokens} forced "
            f"tokens accepted, {stats.steps} steps"
        )
    if stats.steps_sat_out:
        parts.append(
            f"pacing: slow masks sat out {_count(stats.steps_sat_out, 'request step')} "
            f"({_count(stats.paced_requests, 'time')} paced)"
        )
    return "; ".join(parts)


def _throughput(result: RunResult) -> str:
    tokens = sum(len(out.token_ids) for out in result.outputs)
    rate = tokens / result.elapsed_s if result.elapsed_s > 0 else 0.0
    counts = f"{_count(len(result.outputs), 'prompt')}, {_count(tokens, 'generated token')}"
    return f"{counts} in {result.elapsed_s:.2f} s ({rate:.1f} tokens/s)"


def _guided_overhead(guide_s: float, step_s: float) -> str:
    """The share of the time in engine steps that went to the guide (masking the logits)."""
    share = 100 * guide_s / step_s if step_s > 0 else 0.0
    return f"guided overhead {share:.1f}% ({guide_s:.3f} s of {step_s:.2f} s in steps)"


FIELDS = ("build_s", "wait_s", "apply_s")


def _mask_times(llm: LLM) -> str:
    """Per step: the host build, what the logits waited for it, the copy and apply."""
    steps = max(1, len(llm.step_times))
    times = list(llm.step_times)
    build, wait, apply = (1000 * sum(getattr(t, f) for t in times) / steps for f in FIELDS)
    mode = "overlapped" if llm.overlap else "not overlapped"
    text = (
        f"mask per step: build {build:.2f} ms ({mode}), waited {wait:.2f} ms, apply {apply:.2f} ms"
    )
    fills = llm.decoder.fill_decisions()
    if fills:
        text += "; fills: " + ", ".join(f"{b} {n}+ {way}" for (b, n), way in fills.items())
    return text


def _acceptance(accepted: int, drafted: int) -> str:
    share = 100 * accepted / drafted if drafted else 0.0
    return f"drafts accepted {accepted}/{drafted} ({share:.1f}%)"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def generate(args: argparse.Namespace) -> int:
    """Generate one output per prompt with a model, optionally under a guide."""
    guide = load_guide(args)
    params = sampling_params(args, guide)
    llm = build_llm(args)
    prompts = chat_prompts(llm, args) if getattr(args, "chat", False) else args.prompts
    result = run(llm, prompts, params, show_progress(len(args.prompts)))
    if args.jsonl:
        print_jsonl(result.outputs)
    else:
        print_plain(result.outputs, guide.schema)
    print(f"guidedec: {summary(llm, result)}", file=sys.stderr)
    if args.model in RANDOM_MODELS:
        print(RANDOM_NOTE.format(model=args.model), file=sys.stderr)
    failed = sum(out.finish_reason == "grammar_error" for out in result.outputs)
    if failed:
        print(f"guidedec: {failed} output(s) ended in grammar_error", file=sys.stderr)
        return GRAMMAR_ERROR_STATUS
    return 0
