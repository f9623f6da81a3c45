"""Put the benchmarks' tables into the README: each ``bench-out/NAME/summary.md`` replaces the
text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` (``make bench-readme`` runs the
benchmarks first); ``auto``'s part of the compliance run's ``misses.md`` becomes
``docs/compliance-misses.md`` beside the README."""

from __future__ import annotations

import re
from pathlib import Path

NAMES = (
    "compliance",
    "apply",
    "decoder",
    "fill",
    "e2e",
    "closing",
    "window",
    "robustness",
    "jump-forward",
    "vllm",
    "quality",
    "quality-modes",
)


class ReadmeError(ValueError):
    """A README without the markers of a section, or with them out of order."""


def splice(text: str, name: str, content: str) -> str:
    """``text`` with the block of section ``name`` replaced by ``content``."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise ReadmeError(f"the README needs exactly one {begin} ... {end} block")
    return pattern.sub(lambda _: f"{begin}\n{content.strip()}\n{end}", text)


def update(readme: Path, results: Path) -> list[str]:
    """Splice every ``results/NAME/summary.md`` that exists into ``readme``; returns the names."""
    text, done = readme.read_text(encoding="utf-8"), []
    for name in NAMES:
        summary = results / name / "summary.md"
        if summary.is_file():
            text = splice(text, name, summary.read_text(encoding="utf-8"))
            done.append(name)
    readme.write_text(text, encoding="utf-8")
    misses = results / "compliance" / "misses.md"
    if misses.is_file():
        write_auto_misses(misses.read_text(encoding="utf-8"), readme.parent / MISSES_DOC)
        done.append(str(MISSES_DOC))
    return done


MISSES_DOC = Path("docs") / "compliance-misses.md"


def write_auto_misses(misses: str, path: Path) -> None:
    """The ``auto`` section of ``misses.md``: every schema it does not cover and every
    non-compliant output, with the backend it was on and the cause."""
    start = misses.find("## auto:")
    if start < 0:
        raise ReadmeError("misses.md has no auto section (run the benchmark with every backend)")
    header = (
        "# Where `auto` misses, and why\n\n"
        "Written by `guidedec bench readme` from the last `make bench-compliance` run (see the "
        'README\'s "Compliance" section): every schema `auto` does not cover and every schema '
        "with a random-logits output that does not validate, with the backend `auto` was on "
        "and the cause.\n\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + misses[start:], encoding="utf-8")
