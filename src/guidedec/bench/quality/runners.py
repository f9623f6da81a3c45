"""Running one mode over one task's items: guidedec's ``LLM``, transformers ``generate`` with
xgrammar's logits processor, and vLLM (in its own interpreter, :mod:`.vllm_worker`).

Every runner gets the same prompts as token ids (rendered once through the model's chat
template), decodes greedily with at most eight sequences at a time, and returns one
:class:`Output` per item, in order.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from guidedec.bench.quality.modes import Mode
from guidedec.engine.llm import LLM
from guidedec.engine.sampling import SamplingParams
from guidedec.grammar.params import GuidedDecodingParams

BATCH = 8


@dataclass(frozen=True)
class Output:
    """One item's output: text, tokens generated, finish reason, and for an output closing
    ended, the share of its characters the budget chose (None otherwise)."""

    text: str
    tokens: int
    finish: str
    forced: float | None = None


@dataclass(frozen=True)
class Job:
    """One task's items as every runner takes them."""

    prompts: list[list[int]]
    schemas: list[dict[str, Any]]
    budgets: list[int]


def guidedec_llm(model: str, mode: Mode) -> LLM:
    return LLM(
        model,
        backend=mode.backend,  # type: ignore[arg-type]
        json_whitespace=mode.whitespace,  # type: ignore[arg-type]
        jump_forward=None if mode.jump_forward else False,
        max_num_seqs=BATCH,
        isolate_compiles=False,
        disable_additional_properties=mode.closed,
    )


def run_guidedec(llm: LLM, mode: Mode, job: Job) -> tuple[list[Output], float]:
    """Every prompt through ``llm``; returns the outputs and the wall seconds."""
    params = [
        SamplingParams(
            max_tokens=budget,
            temperature=0.0,
            guided_decoding=(
                GuidedDecodingParams(json_schema=schema, think_first=mode.think_first)
                if mode.guided
                else None
            ),
            close_within_budget=mode.closing,
        )
        for schema, budget in zip(job.schemas, job.budgets, strict=True)
    ]
    start = time.perf_counter()
    results = llm.generate(cast(Any, job.prompts), params)
    seconds = time.perf_counter() - start
    outputs = []
    for r in results:
        forced = None
        if r.closed_from is not None:
            forced = (len(r.text) - r.closed_from) / max(1, len(r.text))
        outputs.append(Output(r.text, len(r.token_ids), str(r.finish_reason), forced))
    return outputs, seconds


def run_transformers(llm: LLM, job: Job) -> tuple[list[Output], float]:
    """``model.generate`` (greedy, left-padded batches of eight, shortest prompts first) with
    ``xgrammar.contrib.hf.LogitsProcessor`` compiling each schema as xgrammar's defaults do."""
    import xgrammar as xgr

    hf_tokenizer, model = llm.tokenizer.hf_tokenizer, cast(Any, llm.model.model)
    info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=model.config.vocab_size)
    compiler = xgr.GrammarCompiler(info)
    pad = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
    order = sorted(range(len(job.prompts)), key=lambda i: len(job.prompts[i]))
    outputs: dict[int, Output] = {}
    start = time.perf_counter()
    for at in range(0, len(order), BATCH):
        rows = order[at : at + BATCH]
        grammars = [compiler.compile_json_schema(json.dumps(job.schemas[i])) for i in rows]
        width = max(len(job.prompts[i]) for i in rows)
        ids = [[pad] * (width - len(job.prompts[i])) + job.prompts[i] for i in rows]
        mask = [[0] * (width - len(job.prompts[i])) + [1] * len(job.prompts[i]) for i in rows]
        with torch.inference_mode():
            out = model.generate(
                input_ids=torch.tensor(ids),
                attention_mask=torch.tensor(mask),
                max_new_tokens=max(job.budgets[i] for i in rows),
                do_sample=False,
                logits_processor=[xgr.contrib.hf.LogitsProcessor(grammars)],
                pad_token_id=pad,
                eos_token_id=hf_tokenizer.eos_token_id,
            )
        for row, i in enumerate(rows):
            generated = out[row, width:].tolist()[: job.budgets[i]]
            ended = hf_tokenizer.eos_token_id in generated
            if ended:
                generated = generated[: generated.index(hf_tokenizer.eos_token_id)]
            text = hf_tokenizer.decode(generated, skip_special_tokens=True)
            outputs[i] = Output(text, len(generated) + ended, "stop" if ended else "length")
    return [outputs[i] for i in range(len(job.prompts))], time.perf_counter() - start


def run_vllm(
    python: str, folder: Path, modes: Sequence[Mode], jobs: dict[str, Job], log: Path
) -> dict[tuple[str, str], tuple[list[Output], float]]:
    """Every job in each vLLM mode, in one vLLM process started with ``python``; keyed by
    (mode name, task name)."""
    with tempfile.TemporaryDirectory() as work:
        request, answer = Path(work) / "in.json", Path(work) / "out.json"
        request.write_text(
            json.dumps(
                {
                    "model": str(folder),
                    "modes": [m.engine for m in modes],
                    "jobs": {name: vars(job) for name, job in jobs.items()},
                }
            )
        )
        command = [python, "-m", "guidedec.bench.quality.vllm_worker", str(request), str(answer)]
        with log.open("w") as sink:
            subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, check=True)
        done = json.loads(answer.read_text())
    results = {}
    for mode in modes:
        for name in jobs:
            cell = done[mode.engine][name]
            outs = [Output(o["text"], o["tokens"], o["finish"]) for o in cell["outputs"]]
            results[(mode.name, name)] = (outs, cell["seconds"])
    return results
