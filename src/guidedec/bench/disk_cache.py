"""Reading a compiled grammar from the disk cache against compiling it, on slow schemas.

The candidates are the first ``--per-subset`` JSON schemas of every JSONSchemaBench subset of the
shared data; each is compiled once with xgrammar (the default tokenizer, flexible whitespace)
and the ``--top`` slowest are kept. For each of those, in the same run: a fresh compile (a new
factory, nothing cached), the write of its entry, and the read back by a factory started
afterwards (what a restarted server does), each the median of ``--repeat`` rounds; plus the
entry's size on disk. Reported per schema and in total: compile ms, read ms, their ratio.

Run: ``HF_HUB_OFFLINE=1 guidedec bench disk-cache``
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from guidedec.bench.cases import SHARED_DATA
from guidedec.bench.environment import environment
from guidedec.bench.plots import write_report, write_summary
from guidedec.bench.text import plain
from guidedec.grammar.cache import guide_cache_key
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.disk_cache import SUFFIX
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.grammar.xgrammar_backend import XGrammarMatcherFactory
from guidedec.tokenizer import TokenizerInfo

DATA = SHARED_DATA / "jsonschemabench"


def candidates(data: Path, per_subset: int) -> list[tuple[str, str]]:
    out = []
    for path in sorted(data.glob("*.jsonl")):
        with path.open() as f:
            for i, line in enumerate(f):
                if i >= per_subset:
                    break
                out.append((f"{path.stem}/{i}", json.dumps(json.loads(line)["schema"])))
    return out


def _factory(tokenizer: TokenizerInfo, directory: str | None) -> XGrammarMatcherFactory:
    config = GuidedDecodingConfig(
        backend="xgrammar", tokenizer=tokenizer, compile_cache_dir=directory
    )
    factory = XGrammarMatcherFactory(config)
    if factory.disk is not None:
        factory.disk.min_compile_s = 0.0
    return factory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--data", type=Path, default=DATA, help="JSONSchemaBench folder")
    parser.add_argument("--per-subset", type=int, default=40)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    tokenizer = TokenizerInfo.default()
    records: list[dict[str, Any]] = []
    too_large: list[str] = []
    for name, schema in _slowest(tokenizer, args.data, args.per_subset, args.top):
        record = _measure(tokenizer, name, schema, args.repeat)
        if record["read_ms"] is None:
            compile_s, held = record["compile_ms"] / 1e3, record["grammar_bytes"]
            too_large.append(f"{name} ({compile_s:.1f} s, {held / 1e6:.0f} MB)")
        else:
            records.append(record)
    text = _summary(records, too_large, args.per_subset, args.repeat)
    print(text)
    if args.out is not None:
        write_report(args.out, "bench_disk_cache", {"environment": environment(), "rows": records})
        write_summary(args.out, text)


def _slowest(tokenizer: TokenizerInfo, data: Path, per_subset: int, top: int) -> list[Any]:
    """The ``top`` schemas slowest to compile of the first ``per_subset`` of each subset that
    xgrammar compiles, as ``(name, schema)``, slowest first."""
    scan = _factory(tokenizer, None)
    timed = []
    for name, schema in candidates(data, per_subset):
        start = time.perf_counter()
        try:
            scan._compile_unchecked(GuidedDecodingParams(json_schema=schema))
        except Exception:  # refused by xgrammar: not a candidate
            continue
        timed.append((time.perf_counter() - start, name, schema))
    timed.sort(reverse=True)
    return [(name, schema) for _, name, schema in timed[:top]]


def _measure(tokenizer: TokenizerInfo, name: str, schema: Any, repeat: int) -> dict[str, Any]:
    """Median compile, write and read milliseconds of one schema; ``read_ms`` None when the
    cache would not keep its entry (past its size limit)."""
    params = GuidedDecodingParams(json_schema=schema)
    compiles, writes, reads, size = [], [], [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        compiled = _factory(tokenizer, None).compile(params)
        compiles.append(time.perf_counter() - start)
        held = int(compiled.memory_size_bytes)
        with tempfile.TemporaryDirectory() as directory:
            writer = _factory(tokenizer, directory)
            assert writer.disk is not None
            if not writer.disk.worth_storing(compiles[-1], held):
                break  # what the cache would do: not kept
            start = time.perf_counter()
            writer.disk.store(guide_cache_key(params), compiled.serialize_json())
            writes.append(time.perf_counter() - start)
            del compiled
            size = sum(p.stat().st_size for p in Path(directory).glob("*" + SUFFIX))
            reader = _factory(tokenizer, directory)  # a restarted process
            start = time.perf_counter()
            reader.compile(params)
            reads.append(time.perf_counter() - start)
            assert reader.disk is not None and reader.disk.stats.hits == 1
    return {
        "schema": name,
        "compile_ms": statistics.median(compiles) * 1e3,
        "write_ms": statistics.median(writes) * 1e3 if reads else None,
        "read_ms": statistics.median(reads) * 1e3 if reads else None,
        "entry_bytes": size,
        "grammar_bytes": held,
    }


def _summary(
    records: list[dict[str, Any]], too_large: list[str], per_subset: int, repeat: int
) -> str:
    rows = [
        f"| {r['schema']} | {r['compile_ms']:.0f} | {r['write_ms']:.0f} | {r['read_ms']:.0f} "
        f"| {r['read_ms'] / r['compile_ms']:.2f} | {r['grammar_bytes'] / 1e6:.1f} "
        f"| {r['entry_bytes'] / 1e6:.1f} |"
        for r in records
    ]
    total_compile = sum(r["compile_ms"] for r in records)
    total_read = sum(r["read_ms"] for r in records)
    faster = sum(r["read_ms"] < r["compile_ms"] for r in records)
    return "\n".join(
        [
            f"xgrammar, the {len(records)} slowest to compile of the first {per_subset} "
            f"schemas of each JSONSchemaBench subset; median of {repeat} (write: serialize "
            "and store the entry, once per guide; read: by a factory started afterwards)",
            "",
            "| schema | compile ms | write ms | read ms | read / compile | grammar MB | entry MB |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"total: compile {total_compile:.0f} ms, read {total_read:.0f} ms "
            f"({total_read / max(total_compile, 1e-9):.2f}x); read faster for {faster} of "
            f"{len(records)}",
            f"not kept (entry estimated past the 256 MB limit): {len(too_large)}"
            + (f": {', '.join(too_large)}" if too_large else ""),
        ]
    )


if __name__ == "__main__":
    main()
