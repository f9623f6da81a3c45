"""What ``guidedec bench e2e`` measures ``guidedec.LLM`` against, in the same process and
on the same weights: ``transformers`` ``model.generate`` running guidedec's own
``GuidedLogitsProcessor`` on a left-padded batch; and, in fresh processes, the peak RSS of one
guided batch with the engine's batched runner and with the per-sequence runner it replaced.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Any, cast

import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.engine.runner import ModelRunner
from guidedec.integrations.transformers import GuidedLogitsProcessor


def transformers_generate(
    llm: LLM, prompts: list[str], tokens: int, guide: GuidedDecodingParams, seed: int
) -> tuple[int, float, float]:
    """One ``model.generate`` of ``prompts`` (left-padded) sampling ``tokens`` tokens each at
    temperature 1 (no top-k, no top-p) under ``guide``: (tokens generated, wall s, CPU s)."""
    tokenizer, model = llm.tokenizer, cast(Any, llm.model.model)
    encoded = [tokenizer.encode(p) for p in prompts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
    processor = GuidedLogitsProcessor(
        guide,
        tokenizer,
        backend=llm.config.backend,
        vocab_size=tokenizer.vocab_size,
        prompt_length=width,
    )
    torch.manual_seed(seed)
    start, cpu_start = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            logits_processor=[processor],
            pad_token_id=pad,
        )
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    generated = out.shape[1] - width
    if generated != tokens:
        raise AssertionError(f"transformers generated {generated} of {tokens} tokens per row")
    return len(prompts) * tokens, seconds, cpu_s


def rss_probe(runner: str, batch: int, tokens: int, guide: dict[str, Any]) -> int:
    """Run one guided batch in this process; returns its peak RSS in KiB."""
    llm = LLM("tiny-random", max_num_seqs=batch)
    if runner == "per-sequence":
        llm.runner = ModelRunner(llm.model, max_num_seqs=batch)
    params = SamplingParams(
        max_tokens=tokens,
        temperature=1.0,
        seed=0,
        guided_decoding=GuidedDecodingParams(json_schema=guide),
    )
    llm.generate([f"Record {i}: a person, as JSON." for i in range(batch)], [params] * batch)
    llm.close()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_rss_kib(batch: int, tokens: int, guide: dict[str, Any]) -> dict[str, int]:
    """Peak RSS of :func:`rss_probe` for each runner, each in a fresh process."""
    result = {}
    for runner in ("batched", "per-sequence"):
        command = [
            sys.executable,
            "-m",
            "guidedec.bench.e2e_baselines",
            runner,
            str(batch),
            str(tokens),
            json.dumps(guide),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=900)
        result[runner] = int(done.stdout.split()[-1])
    return result


if __name__ == "__main__":
    name, batch_arg, tokens_arg, guide_arg = sys.argv[1:5]
    torch.set_num_threads(1)
    print(rss_probe(name, int(batch_arg), int(tokens_arg), json.loads(guide_arg)))
