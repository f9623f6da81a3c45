"""``guidedec bench``: the measuring instruments behind one command.

Each benchmark is a module of :mod:`guidedec.bench`, installed with the package: ``compliance``,
``apply``, ``closing``, ``decoder``, ``disk-cache``, ``e2e``, ``fill``, ``jump-forward``,
``quality`` (answer quality on a real model), ``robustness``, ``tools`` (BFCL tool calls on a
real model, against vLLM's server), ``window``, and ``vllm`` (where vLLM is installed), plus
``gil``, ``gpu-apply`` and ``graphs``. The ones that read the public test data find it beside a
source checkout (``../shared/data``) or in ``$GUIDEDEC_DATA``.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from guidedec.bench.text import plain

MODULES = {
    "compliance": "compliance",
    "apply": "apply",
    "closing": "closing",
    "decoder": "decoder",
    "disk-cache": "disk_cache",
    "e2e": "e2e",
    "fill": "fill",
    "gil": "gil",
    "gpu-apply": "gpu_apply",
    "graphs": "graphs",
    "jump-forward": "jump_forward",
    "quality": "quality",
    "robustness": "robustness",
    "tools": "tools",
    "vllm": "vllm",
    "window": "window",
}
"""Benchmark name -> its module under ``guidedec.bench`` (each has ``main(argv)``)."""


class BenchError(RuntimeError):
    """A benchmark cannot run here; the message says why."""


def add_bench(commands: Any) -> None:
    run = commands.add_parser(
        "bench",
        help=f"run a benchmark ({', '.join(MODULES)})",
        description=plain(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "name",
        choices=[*MODULES, "readme"],
        help="which benchmark ('readme': put bench-out/*/summary.md into README.md)",
    )
    run.add_argument("args", nargs=argparse.REMAINDER, help="its options (see NAME --help)")
    run.set_defaults(func=bench)


def bench(args: argparse.Namespace) -> int:
    """Run one benchmark with its own command-line options."""
    if args.name == "readme":
        return update_readme(args.args)
    name = MODULES[args.name]
    try:
        module = importlib.import_module(f"guidedec.bench.{name}")
    except ModuleNotFoundError as exc:  # vllm, triton: what a benchmark compares against
        if exc.name is None or exc.name.startswith("guidedec"):
            raise
        raise BenchError(
            f"'guidedec bench {args.name}' needs {exc.name}, not installed here"
        ) from exc
    try:
        code = module.main(args.args)
    except SystemExit as exc:  # argparse: --help, a bad option
        return int(exc.code or 0) if isinstance(exc.code, int | None) else 1
    return int(code or 0)


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
