"""The layer graph of ``docs/architecture.md`` is the real one: no module imports a layer above
its own, siblings do not import each other, and every package of the tree is in the graph."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "guidedec"
DOC = ROOT / "docs" / "architecture.md"
ROOT_PACKAGE = "guidedec"  # ``import guidedec`` re-exports the engine: a top-layer import


def documented_layers() -> list[list[str]]:
    """The graph's layers, bottom first: the ``layer N: a, b`` lines of the doc's graph block."""
    block = DOC.read_text().split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    layers: dict[int, list[str]] = {}
    for number, names in re.findall(r"^layer (\d+): (.+)$", block, flags=re.MULTILINE):
        layers[int(number)] = [name.strip() for name in names.split(",")]
    assert sorted(layers) == list(range(len(layers))), "layers are numbered 0, 1, 2, ..."
    return [layers[n] for n in range(len(layers))]


def unit_of(path: Path) -> str:
    """The graph's name for a source file: its top-level package or module under guidedec."""
    rel = path.relative_to(SOURCE)
    if rel.parts == ("__init__.py",):
        return ROOT_PACKAGE
    return rel.parts[0].removesuffix(".py")


def imported_units(path: Path) -> set[str]:
    """The units a file imports (absolute imports of guidedec; relative ones are not used)."""
    units: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == ROOT_PACKAGE:
                units.add(parts[1] if len(parts) > 1 else ROOT_PACKAGE)
    return units


def test_every_unit_of_the_tree_is_in_the_documented_graph() -> None:
    documented = {name for layer in documented_layers() for name in layer}
    actual = {unit_of(path) for path in SOURCE.rglob("*.py")}
    assert actual - documented == set(), "add these to docs/architecture.md"
    assert documented - actual == set(), "these are in docs/architecture.md but not in the tree"


def test_no_module_imports_its_own_layer_or_one_above() -> None:
    rank = {name: i for i, layer in enumerate(documented_layers()) for name in layer}
    upward = []
    for path in sorted(SOURCE.rglob("*.py")):
        unit = unit_of(path)
        for target in imported_units(path) - {unit}:
            if rank[target] >= rank[unit]:
                upward.append(f"{path.relative_to(ROOT)} ({unit}) imports {target}")
    assert upward == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text("from guidedec.engine.llm import LLM\nimport guidedec.bitmask\nimport os\n")
    assert imported_units(module) == {"engine", "bitmask"}
