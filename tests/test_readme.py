"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 2
    namespace: dict[str, object] = {}
    for block in blocks:
        if block.startswith("# (needs the server above)"):
            continue  # exercised by tests/test_server.py against a live server
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["failed"] == []
    assert isinstance(namespace["matcher"].is_terminated(), bool)  # type: ignore[attr-defined]


def test_readme_opens_with_the_two_setup_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    commands = [line.split("#")[0].strip() for line in lines[:8] if line.startswith("make ")]
    assert commands == ["make demo", "make test"]
