"""Tool calling on a real model: BFCL questions through guidedec's server and vLLM's, with the
official ``openai`` client, scored by call accuracy and valid-call rate (95% Wilson intervals).

Each server runs SmolLM2-135M-Instruct (the bundled GGUF, dequantized): guidedec with
``--enable-auto-tool-choice``, vLLM with ``--enable-auto-tool-choice --tool-call-parser hermes
--tool-strict-level parameter`` (its arguments held to their schemas, as guidedec's are; vLLM's
default level holds only the arguments of ``strict`` tools). Modes:

- ``auto``: ``tool_choice="auto"``, servers started with ``--enable-auto-tool-choice``
  (hermes format, the one guidedec's tools-as-text prompt teaches);
- ``required``: ``tool_choice="required"``;
- ``named``: ``tool_choice`` names the expected function (``simple_python`` and ``multiple``).

Prompts: ``tools shown``, the tools in the system turn (guidedec by default; vLLM through a chat
template that writes them the same way, checked token for token with ``/tokenize``), or ``not
shown`` (the model's own template, which renders no tools: the call's grammar alone carries
them, as guidedec did before). ``parallel_tool_calls`` is false except for ``parallel``.

Run: ``guidedec bench tools --vllm .venv-vllm/bin/python`` (needs ``bfcl-eval``, installed
with ``--no-deps``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from guidedec.bench import bfcl
from guidedec.bench.plots import write_scores
from guidedec.bench.quality.report import wilson
from guidedec.bench.text import plain
from guidedec.engine.chat import TOOLS_INSTRUCTION, TOOLS_PREAMBLE
from guidedec.engine.gguf import SMOLLM2, converted

MODES = ("auto", "required", "named")
PROMPTS = ("tools shown", "not shown")
TOOLS_TEMPLATE = "".join(
    [
        "{%- set rest = messages -%}{%- if tools -%}{{- '<|im_start|>system\\n' -}}",
        "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n\\n' -}}",
        "{%- set rest = messages[1:] -%}{%- endif -%}",
        "{{- " + json.dumps(TOOLS_PREAMBLE + "\n<tools>\n") + " -}}",
        "{%- for t in tools -%}{{- {'type': 'function', 'function': {",
        "'name': t['function']['name'], 'description': t['function']['description'], ",
        "'parameters': t['function']['parameters']}} | tojson -}}",
        "{%- if not loop.last -%}{{- '\\n' -}}{%- endif -%}{%- endfor -%}",
        "{{- " + json.dumps("\n</tools>\n\n" + TOOLS_INSTRUCTION + "<|im_end|>\n") + " -}}",
        "{%- endif -%}{%- for message in rest -%}",
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}",
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}",
        "{%- endif -%}",
    ]
)
"""SmolLM2's ChatML with the tools written as guidedec writes them for a template that shows
none (:func:`guidedec.engine.chat.tools_as_text`): vLLM's prompt, the same tokens as
guidedec's."""
HIDDEN = "{#- tools and tool_calls are not shown -#}"
"""Prefixed to the model's template: a template that names tools renders them itself, so
guidedec adds none (and knows no call format: ``required`` and named are JSON)."""


@dataclass
class Tally:
    right: int = 0
    valid: int = 0
    total: int = 0
    refused: int = 0  # HTTP 400s
    by_category: dict[str, list[int]] = field(default_factory=dict)  # [right, valid, total]

    def add(self, category: str, right: bool, valid: bool) -> None:
        self.right, self.valid, self.total = self.right + right, self.valid + valid, self.total + 1
        row = self.by_category.setdefault(category, [0, 0, 0])
        row[0], row[1], row[2] = row[0] + right, row[1] + valid, row[2] + 1


def ask(
    client: openai.OpenAI, model: str, question: bfcl.Question, mode: str, max_tokens: int
) -> tuple[list[tuple[str, Any]] | None, str]:
    """The calls of one answer (None where arguments are no JSON), and its finish reason."""
    extra: dict[str, Any] = {}
    if mode == "named":
        (expected,) = question.answers[0]
        name = next(n for n, own in question.names.items() if own == expected)
        extra["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        extra["tool_choice"] = mode
    try:
        out = _create(client, model, question, max_tokens, extra)
    except openai.BadRequestError as exc:  # the server refused the request: no call
        return None, f"400: {exc.message}"
    choice = out.choices[0]
    calls = []
    for call in choice.message.tool_calls or []:
        try:
            calls.append((call.function.name, json.loads(call.function.arguments)))
        except json.JSONDecodeError:
            return None, str(choice.finish_reason)
    return calls, str(choice.finish_reason)


def _create(
    client: openai.OpenAI,
    model: str,
    question: bfcl.Question,
    max_tokens: int,
    extra: dict[str, Any],
) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=question.messages,  # type: ignore[arg-type]
        tools=bfcl.request_tools(question),  # type: ignore[arg-type]
        parallel_tool_calls=question.category == "parallel",
        max_tokens=max_tokens,
        temperature=0,
        **extra,
    )


def run_mode(
    base_url: str,
    model: str,
    questions: Sequence[bfcl.Question],
    mode: str,
    max_tokens: int,
    concurrency: int,
) -> tuple[Tally, list[dict[str, Any]]]:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    asked = [q for q in questions if mode != "named" or len(q.answers) == 1]
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda q: ask(client, model, q, mode, max_tokens), asked))
    tally, details = Tally(), []
    for question, (calls, reason) in zip(asked, answers, strict=True):
        right = calls is not None and bfcl.correct(calls, question)
        valid = calls is not None and bfcl.valid(calls, question)
        tally.add(question.category, right, valid)
        tally.refused += reason.startswith("400")
        details.append({"id": question.id, "calls": calls, "finish_reason": reason, "right": right})
    return tally, details


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(command: list[str], port: int, log: Path) -> Iterator[str]:
    """A server process, up once ``/health`` answers; stopped on leaving."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 600
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the server exited: see {log}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start in 600 s: see {log}")
                time.sleep(1)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def commands(
    engine: str,
    prompt: str,
    port: int,
    templates: Path,
    vllm_python: str | None,
    strict_level: str = "parameter",
) -> list[str]:
    folder = converted(SMOLLM2)
    if engine == "guidedec":
        command = [sys.executable, "-m", "guidedec", "serve", "--model", SMOLLM2]
        command += ["--port", str(port), "--enable-auto-tool-choice", "--max-num-seqs", "8"]
        if prompt == "not shown":
            command += ["--chat-template", str(templates / "hidden.jinja")]
        return command
    assert vllm_python is not None
    command = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--served-model-name", SMOLLM2, "--port", str(port), "--dtype", "float32"]
    command += ["--max-model-len", "4096", "--max-num-seqs", "8", "--enforce-eager"]
    command += ["--gpu-memory-utilization", "0.25"]  # on CPU: the share of memory it takes
    # vLLM serves required and named only with a parser, and loads one only with auto on
    command += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    command += ["--tool-strict-level", strict_level]
    if prompt == "tools shown":
        command += ["--chat-template", str(templates / "tools.jinja")]
    return command


def same_prompts(urls: dict[str, str], questions: Sequence[bfcl.Question]) -> None:
    """Raise unless both servers tokenize the first questions' chats the same way."""
    for question in questions[:5]:
        tokens = []
        for url in urls.values():
            body = {
                "model": SMOLLM2,
                "messages": question.messages,
                "tools": bfcl.request_tools(question),
                "add_generation_prompt": True,
            }
            reply = httpx.post(url.removesuffix("/v1") + "/tokenize", json=body, timeout=60)
            reply.raise_for_status()
            tokens.append(reply.json()["tokens"])
        if tokens[0] != tokens[-1]:
            raise AssertionError(f"{question.id}: the servers' prompts differ")


def summary(tallies: dict[str, Tally], per_category: int, max_tokens: int) -> str:
    lines = [
        f"model: {SMOLLM2} (bundled GGUF, float32); BFCL {', '.join(bfcl.CATEGORIES)}, the "
        f"first {per_category} questions of each; greedy; max_tokens {max_tokens}",
        "",
        "| server | prompt | tool_choice | calls right | 95% interval | valid calls | 95% interval "
        "| refused | right per category |",
        "|---|---|---|---:|---|---:|---|---:|---|",
    ]
    for name, t in tallies.items():
        right, valid = wilson(t.right, t.total), wilson(t.valid, t.total)
        categories = ", ".join(f"{c} {r}/{n}" for c, (r, _, n) in t.by_category.items())
        lines.append(
            f"| {name} | {t.right}/{t.total} ({t.right / t.total:.0%}) | "
            f"{right[0]:.0%} to {right[1]:.0%} | {t.valid}/{t.total} ({t.valid / t.total:.0%}) "
            f"| {valid[0]:.0%} to {valid[1]:.0%} | {t.refused} | {categories} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--per-category", type=int, default=40)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=PROMPTS)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--vllm", metavar="PYTHON", help="vLLM's Python (e.g. .venv-vllm/bin/python)"
    )
    parser.add_argument(
        "--engines", nargs="+", default=["guidedec", "vllm"], choices=["guidedec", "vllm"]
    )
    parser.add_argument(
        "--vllm-strict-level",
        default="parameter",
        choices=["auto", "function", "parameter"],
        help="vLLM's --tool-strict-level: parameter (default) holds arguments to their schemas, "
        "as guidedec does; vLLM's own default, auto, only those of strict tools",
    )
    parser.add_argument("--out", type=Path, help="directory for bench_tools.json")
    args = parser.parse_args(argv)
    questions = [q for c in bfcl.CATEGORIES for q in bfcl.load(c, args.per_category)]
    converted(SMOLLM2)  # convert once, before any server starts
    tallies: dict[str, Tally] = {}
    details: dict[str, list[dict[str, Any]]] = {}
    logs = Path(args.out or tempfile.mkdtemp(prefix="guidedec-bench-tools-"))
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        templates = Path(work)
        (templates / "tools.jinja").write_text(TOOLS_TEMPLATE)
        own = (converted(SMOLLM2) / "chat_template.jinja").read_text()
        (templates / "hidden.jinja").write_text(HIDDEN + own)
        for prompt in args.prompts:
            _run_prompt(args, prompt, questions, templates, logs, tallies, details)
    text = summary(tallies, args.per_category, args.max_tokens)
    print(text)
    if args.out is not None:
        write_scores(args.out, "bench_tools", tallies, details, text)


def _run_prompt(
    args: argparse.Namespace,
    prompt: str,
    questions: list[Any],
    templates: Path,
    logs: Path,
    tallies: dict[str, Tally],
    details: dict[str, list[dict[str, Any]]],
) -> None:
    """Every engine's server with ``prompt``'s chat template, and each mode through them."""
    engines = [e for e in args.engines if e != "vllm" or args.vllm]
    with contextlib.ExitStack() as stack:
        urls = {}
        for engine in engines:
            port = _port()
            command = commands(engine, prompt, port, templates, args.vllm, args.vllm_strict_level)
            log = logs / f"{engine}-{prompt.replace(' ', '-')}.log"
            urls[engine] = stack.enter_context(server(command, port, log))
        if prompt == "tools shown" and len(urls) > 1:
            same_prompts(urls, questions)
        for engine, url in urls.items():
            for mode in args.modes:
                if mode == "auto" and prompt == "not shown":
                    continue  # the model is not told of the tools
                label = engine
                if engine == "vllm":
                    label = f"vllm (tool strict level {args.vllm_strict_level})"
                name = f"{label} | {prompt} | {mode}"
                began = time.monotonic()
                tallies[name], details[name] = run_mode(
                    url, SMOLLM2, questions, mode, args.max_tokens, args.concurrency
                )
                print(
                    f"{name}: {tallies[name].right}/{tallies[name].total} right, "
                    f"{tallies[name].valid} valid, {time.monotonic() - began:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )


if __name__ == "__main__":
    main()
