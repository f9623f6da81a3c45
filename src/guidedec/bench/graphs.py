"""Generated tokens/s of ``guidedec.LLM`` with ``cuda_graphs`` on and off, and a check that both
give the same tokens.

``tiny-random``, greedy, a batch of ``--batch`` requests guided by a JSON schema (an array of at
least ``tokens + 1`` objects of ``examples/person.schema.json``, which cannot end within
``--tokens`` tokens, so every request generates exactly ``--tokens`` tokens; asserted). Each
engine is warmed up first (grammar compiled, the steady batch's decode graph captured), then
timed over ``--repeats`` runs; tok/s is the median. The outputs of the two engines must be
identical token for token (float64 by default: the static and dynamic caches reduce attention
over different lengths, and in float32 a rounding difference may flip a near-tie argmax).

On CUDA this measures the graph replay against eager launches; on the CPU there is no graph, so
the ratio measures the static-cache path (attention over the whole preallocated cache) against
the dynamic one. ``--out DIR`` writes ``bench_graphs.json``; the exit status is 1 when the
outputs differ.

Run: ``HF_HUB_OFFLINE=1 guidedec bench graphs --device cpu --tokens 16``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.cases import person_array_schema
from guidedec.bench.environment import environment
from guidedec.bench.plots import write_report
from guidedec.bench.text import plain

MODES = {"eager": False, "graphs": True}  # mode -> cuda_graphs


def run_mode(args: argparse.Namespace, cuda_graphs: bool) -> dict[str, Any]:
    """Warm up one engine, then time ``args.repeats`` runs: tok/s, outputs, captures."""
    llm = LLM(
        "tiny-random",
        backend=args.backend,
        max_num_seqs=args.batch,
        device=args.device,
        dtype=args.dtype,
        cuda_graphs=cuda_graphs,
        jump_forward=False,  # graphs against eager steps alike (a verifying step runs eagerly)
    )
    guide = GuidedDecodingParams(json_schema=person_array_schema(args.tokens))
    prompts = [f"Record {i}: a person, as JSON." for i in range(args.batch)]
    llm.generate(prompts, params(args.batch, 4, guide))  # compile, capture (not timed)
    rates, outputs = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        results = llm.generate(prompts, params(args.batch, args.tokens, guide))
        seconds = time.perf_counter() - start
        outputs = [out.token_ids for out in results]
        check_lengths(results, args.tokens)
        rates.append(args.batch * args.tokens / seconds)
    captures = llm.graphs.captures if llm.graphs is not None else 0
    llm.close()
    return {"tokens_per_s": statistics.median(rates), "runs": rates, "outputs": outputs,
            "captures": captures}  # fmt: skip


def params(batch: int, tokens: int, guide: GuidedDecodingParams) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=tokens, guided_decoding=guide) for _ in range(batch)]


def check_lengths(results: list[Any], tokens: int) -> None:
    for out in results:
        if out.finish_reason != "length" or len(out.token_ids) != tokens:
            raise AssertionError(
                f"request {out.request_id} ended with {out.finish_reason} after "
                f"{len(out.token_ids)} of {tokens} tokens ({out.error})"
            )


def report(args: argparse.Namespace, modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    eager, graphs = modes["eager"], modes["graphs"]
    return {
        "argv": sys.argv[1:],
        "model": "tiny-random",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "dtype": args.dtype,
        "backend": args.backend,
        "batch": args.batch,
        "tokens_per_request": args.tokens,
        "guide": {"schema_file": "examples/person.schema.json", "min_items": args.tokens + 1},
        "repeats": args.repeats,
        "eager_tokens_per_s": eager["tokens_per_s"],
        "graphs_tokens_per_s": graphs["tokens_per_s"],
        "graphs_over_eager": graphs["tokens_per_s"] / eager["tokens_per_s"],
        "graphs_captured": graphs["captures"],
        "identical_outputs": eager["outputs"] == graphs["outputs"],
        "runs": {mode: result["runs"] for mode, result in modes.items()},
        **environment(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device, choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=8, help="requests decoded together")
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode")
    parser.add_argument("--backend", default="xgrammar", choices=["auto", "xgrammar", "llguidance"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--out", type=Path, help="directory for bench_graphs.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    modes = {mode: run_mode(args, cuda_graphs) for mode, cuda_graphs in MODES.items()}
    result = report(args, modes)
    print(
        f"tiny-random on {args.device} ({args.dtype}), batch {args.batch}, {args.tokens} tokens, "
        f"JSON schema: eager {result['eager_tokens_per_s']:.1f} tok/s, graphs "
        f"{result['graphs_tokens_per_s']:.1f} tok/s ({result['graphs_over_eager']:.2f}x), "
        f"{result['graphs_captured']} graph(s) captured, identical outputs: "
        f"{result['identical_outputs']}"
    )
    if args.out is not None:
        print(f"wrote {write_report(args.out, 'bench_graphs', result)}")
    return 0 if result["identical_outputs"] else 1


if __name__ == "__main__":
    sys.exit(main())
