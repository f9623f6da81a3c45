"""The vLLM side of ``guidedec bench quality``, run by vLLM's interpreter: reads the jobs
(``in.json``), decodes each in each mode asked for, writes the outputs (``out.json``).

Modes: ``vllm`` (``StructuredOutputsParams(json=schema)``: vLLM's own structured outputs, its
defaults) and ``vllm-plugin`` (``extra_args={"guidedec": {"json_schema": schema}}``: guidedec's
logits processor, flexible whitespace). One ``vllm.LLM`` (float32, eager, eight sequences at a
time, greedy) serves both. A request vLLM refuses (a schema its backend rejects) gets an empty
output with finish reason ``refused``; the others still run.

Run: ``python -m guidedec.bench.quality.vllm_worker in.json out.json``
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import StructuredOutputsParams

from guidedec.integrations.vllm import GuidedLogitsProcessor


def params(mode: str, schema: dict[str, Any], budget: int) -> SamplingParams:
    common: dict[str, Any] = {"max_tokens": budget, "temperature": 0.0}
    if mode == "vllm":
        return SamplingParams(**common, structured_outputs=StructuredOutputsParams(json=schema))
    return SamplingParams(**common, extra_args={"guidedec": {"json_schema": schema}})


def output(result: Any) -> dict[str, Any]:
    best = result.outputs[0]
    return {"text": best.text, "tokens": len(best.token_ids), "finish": str(best.finish_reason)}


def run(llm: LLM, mode: str, job: dict[str, Any]) -> dict[str, Any]:
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    sampling = [params(mode, s, b) for s, b in zip(job["schemas"], job["budgets"], strict=True)]
    start = time.perf_counter()
    try:
        outs = [output(r) for r in llm.generate(prompts, sampling, use_tqdm=False)]
    except (ValueError, RuntimeError):  # one refused request fails the call: go one by one
        outs = []
        for prompt, one in zip(prompts, sampling, strict=True):
            try:
                outs.append(output(llm.generate([prompt], one, use_tqdm=False)[0]))
            except (ValueError, RuntimeError) as exc:
                print(f"refused: {exc}", file=sys.stderr, flush=True)
                outs.append({"text": "", "tokens": 0, "finish": "refused"})
    return {"outputs": outs, "seconds": time.perf_counter() - start}


def main(argv: list[str]) -> None:
    request = json.loads(Path(argv[0]).read_text())
    llm = LLM(
        request["model"],
        dtype="float32",
        max_model_len=4096,
        max_num_seqs=8,
        enforce_eager=True,
        kv_cache_memory_bytes=1 << 30,
        seed=0,
        additional_config={"guidedec": {"json_whitespace": "flexible"}},
        logits_processors=[GuidedLogitsProcessor],
    )
    done: dict[str, dict[str, Any]] = {}
    for mode in request["modes"]:
        done[mode] = {}
        for name, job in request["jobs"].items():
            done[mode][name] = run(llm, mode, job)
            print(f"{mode} {name}: {done[mode][name]['seconds']:.0f} s", file=sys.stderr)
    Path(argv[1]).write_text(json.dumps(done))


if __name__ == "__main__":
    main(sys.argv[1:])
