"""GPU apply kernels against the bandwidth limit: ``apply_bitmask`` (Triton, torch reference)
time per call next to a device-to-device copy of the same logits, by vocabulary and batch.

The copy reads and writes every logit once, which is more traffic than masking needs (the apply
reads the bitmask and writes only forbidden logits), so ``apply / copy`` near or below 1 means
the kernel runs at memory speed. Rows mix real mask shapes: half allow ~1% of the vocabulary
(inside a JSON structure), half ~98% (inside a string). CUDA events, medians of ``--repeats``.

A call timed alone includes its launch from the host (Triton's launcher costs tens of
microseconds, more than the kernel at small batches). The ``graph`` columns time the copy and the
Triton kernel replayed inside a CUDA graph of ``GRAPH_CALLS`` calls, per call: the device time
alone, which is what the engine's decode-step graphs pay.

Usage::

    HF_HUB_OFFLINE=1 guidedec bench gpu-apply --out bench-out/gpu_apply
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from guidedec.bench.environment import environment
from guidedec.bench.plots import write_report, write_summary
from guidedec.bench.text import plain
from guidedec.bitmask import apply_bitmask, bitmask_size
from guidedec.bitmask.apply import Backend
from guidedec.testing import random_bitmask

VOCABS = (128_256, 151_936)
BATCHES = (1, 4, 16, 64, 256)
METHODS: tuple[Backend, ...] = ("triton", "torch")
GRAPH_CALLS = 20


def mixed_bitmask(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    sparse = random_bitmask((rows + 1) // 2, vocab, density=0.01, generator=generator)
    dense = random_bitmask(rows // 2, vocab, density=0.98, generator=generator)
    return torch.cat([sparse, dense])[:rows]


def timed_ms(fn: Any, repeats: int) -> float:
    """Median milliseconds of ``fn()`` by CUDA events (after two warm-up calls)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)


def graphed_ms(fn: Any, repeats: int) -> float:
    """Median milliseconds per call of ``fn()`` replayed in a CUDA graph of ``GRAPH_CALLS``
    calls (warmed up on a side stream first, as capture requires)."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return timed_ms(graph.replay, repeats) / GRAPH_CALLS


def measure(vocab: int, batch: int, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(vocab + batch)
    logits = torch.randn(batch, vocab, generator=generator).to(dtype).cuda()
    bitmask = mixed_bitmask(batch, vocab, generator).cuda()
    assert bitmask.shape[1] == bitmask_size(vocab)
    target = torch.empty_like(logits)
    copy_ms = timed_ms(lambda: target.copy_(logits), repeats)
    row: dict[str, Any] = {"vocab": vocab, "batch": batch, "dtype": str(dtype), "copy_ms": copy_ms}
    reference = logits.clone()
    apply_bitmask(reference, bitmask, backend="torch")
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for method in METHODS:
        work = logits.clone()
        apply_bitmask(work, bitmask, backend=method)  # also the correctness check, bit for bit
        if not torch.equal(work.view(bits), reference.view(bits)):
            raise AssertionError(f"{method} differs from the reference at V={vocab} B={batch}")
        ms = timed_ms(lambda m=method, w=work: apply_bitmask(w, bitmask, backend=m), repeats)
        row[f"{method}_ms"] = ms
        row[f"{method}_over_copy"] = ms / copy_ms
    work = logits.clone()
    row["copy_graph_ms"] = graphed_ms(lambda: target.copy_(logits), repeats)
    row["triton_graph_ms"] = graphed_ms(
        lambda: apply_bitmask(work, bitmask, backend="triton"), repeats
    )
    if not torch.equal(work.view(bits), reference.view(bits)):
        raise AssertionError(f"triton in a graph differs from the reference at V={vocab} B={batch}")
    row["triton_graph_over_copy"] = row["triton_graph_ms"] / row["copy_graph_ms"]
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| vocab | batch | dtype | copy (ms) | triton (ms) | triton / copy | torch ref (ms) "
        "| torch / copy | copy, graph (ms) | triton, graph (ms) | triton / copy, graph |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['vocab']:,} | {r['batch']} | {r['dtype'].removeprefix('torch.')} "
            f"| {r['copy_ms']:.4f} | {r['triton_ms']:.4f} | {r['triton_over_copy']:.2f}x "
            f"| {r['torch_ms']:.4f} | {r['torch_over_copy']:.2f}x "
            f"| {r['copy_graph_ms']:.4f} | {r['triton_graph_ms']:.4f} "
            f"| {r['triton_graph_over_copy']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_apply needs a CUDA device", file=sys.stderr)
        return 1
    rows = [
        measure(vocab, batch, getattr(torch, dtype), args.repeats)
        for dtype in args.dtypes
        for vocab in args.vocabs
        for batch in args.batches
    ]
    text = f"device: {torch.cuda.get_device_name()}\n\n{markdown(rows)}"
    print(text)
    if args.out is not None:
        report = {"argv": sys.argv[1:], **environment(), "rows": rows}
        write_report(args.out, "bench_gpu_apply", report)
        write_summary(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
