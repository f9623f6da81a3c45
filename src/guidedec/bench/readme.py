"""Put the benchmarks' tables into the README: each ``bench-out/NAME/summary.md`` replaces the
text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` (``make bench-readme`` runs the
benchmarks first)."""

from __future__ import annotations

import re
from pathlib import Path

NAMES = ("compliance", "apply", "decoder", "e2e")


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
    return done
