"""``guidedec bench``: the measuring instruments behind one command.

``compliance`` is part of the package; ``apply``, ``closing``, ``decoder``, ``disk-cache``,
``e2e``, ``fill``, ``jump-forward``, ``robustness`` and ``vllm`` (in ``.venv-vllm``) run the
scripts of the same names in the source checkout's ``benchmarks/`` folder (they are developer
tools that compare against other libraries, so they are not installed with the package).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Any

from guidedec.bench.text import plain

SCRIPTS = {
    "apply": "bench_apply.py",
    "closing": "bench_closing.py",
    "decoder": "bench_decoder.py",
    "disk-cache": "bench_disk_cache.py",
    "e2e": "bench_e2e.py",
    "fill": "bench_fill.py",
    "jump-forward": "bench_jump_forward.py",
    "robustness": "bench_robustness.py",
    "vllm": "bench_vllm.py",
}
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


class BenchError(RuntimeError):
    """A benchmark cannot run here; the message says why."""


def add_bench(commands: Any) -> None:
    run = commands.add_parser(
        "bench",
        help="run a benchmark (compliance, apply, closing, decoder, disk-cache, e2e, fill, "
        "jump-forward, robustness, vllm)",
        description=plain(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "name",
        choices=["compliance", *SCRIPTS, "readme"],
        help="which benchmark ('readme': put bench-out/*/summary.md into README.md)",
    )
    run.add_argument("args", nargs=argparse.REMAINDER, help="its options (see NAME --help)")
    run.set_defaults(func=bench)


def bench(args: argparse.Namespace) -> int:
    """Run one benchmark with its own command-line options."""
    if args.name == "compliance":
        from guidedec.bench.compliance import main

        return main(args.args)
    if args.name == "readme":
        return update_readme(args.args)
    script = BENCHMARKS / SCRIPTS[args.name]
    if not script.is_file():
        raise BenchError(
            f"{script} not found: 'guidedec bench {args.name}' runs from a source checkout"
        )
    saved = sys.argv
    sys.argv = [str(script), *args.args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int | None) else 1
    finally:
        sys.argv = saved
    return 0


def update_readme(argv: list[str]) -> int:
    """``guidedec bench readme [--readme PATH] [--results DIR]``."""
    from guidedec.bench.readme import ReadmeError, update

    parser = argparse.ArgumentParser(prog="guidedec bench readme")
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--results", type=Path, default=Path("bench-out"))
    args = parser.parse_args(argv)
    try:
        done = update(args.readme, args.results)
    except (OSError, ReadmeError) as exc:
        raise BenchError(str(exc)) from exc
    print(f"{args.readme}: updated {', '.join(done) or 'nothing'} from {args.results}")
    return 0
