"""``guidedec bench``: each benchmark runs behind the one command."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

from guidedec.bench.cases import COMMITTING_CASES, COMMITTING_GRAMMARS, PERSON_SCHEMA
from guidedec.cli import main
from guidedec.cli_bench import MODULES

ROOT = Path(__file__).resolve().parents[2]


def test_every_benchmark_is_a_module_of_the_package_with_a_main() -> None:
    optional = {"vllm", "triton"}  # what those benchmarks compare against or run on
    for name, module_name in MODULES.items():
        try:
            module = importlib.import_module(f"guidedec.bench.{module_name}")
        except ModuleNotFoundError as exc:
            assert exc.name in optional, (name, exc.name)
            continue
        assert callable(module.main), name


def test_a_benchmark_whose_dependency_is_missing_says_which(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    assert main(["bench", "vllm"]) != 0
    assert "needs vllm, not installed here" in capsys.readouterr().err


def test_the_person_schema_is_the_example_file() -> None:
    example = json.loads((ROOT / "examples" / "person.schema.json").read_text())
    example.pop("$schema")
    assert example == PERSON_SCHEMA


def test_bench_apply_runs_the_apply_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "apply", "--batches", "1", "--repeats", "2", "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "guidedec cpu" in out and "xgrammar cpu" in out


def test_bench_jump_forward_runs_the_engines_default_on_the_long_keys_schema(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = ["--backends", "auto", "--prompts", "1", "--repeats", "1", "--max-tokens", "40"]
    assert main(["bench", "jump-forward", *options]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith("| auto |")]
    assert "| long keys |" in row and row.endswith("| yes |")  # the same tokens on and off
    assert "target (auto, long keys)" in out


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("apply", ["--batches", "1", "2", "--repeats", "2", "--samples", "1"]),
        ("closing", ["--schemas", "1", "--seeds", "1", "--rounds", "1"]),
        (
            "decoder",
            ["--backends", "xgrammar", "--batches", "1", "--drafts", "0", "--repeats", "2"],
        ),
        ("e2e", ["--batches", "1", "--tokens", "3", "--repeats", "1", "--rss-batch", "2"]),
        ("fill", ["--backends", "llguidance", "--batches", "4", "--repeats", "1"]),
    ],
)
def test_bench_out_writes_json_png_and_summary(
    name: str, options: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / name
    assert main(["bench", name, *options, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / f"bench_{name}.json").read_text())
    assert report  # the measurements, with the environment they ran in
    summary = (out / "summary.md").read_text()
    assert summary.strip() and summary.strip().splitlines()[-1] in printed  # the printed tables
    assert "|---" in summary
    assert (out / f"bench_{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_window_closes_the_constructed_guides_with_sized_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outputs that commit to more than 64 tokens all end complete with windows sized from the
    reach (each row: guides, budget, outputs, complete sized, complete with 64, ratios)."""
    options = ["--schemas", "1", "--budgets", "96", "--outputs", "2", "--backend", "xgrammar"]
    out = tmp_path / "window"
    assert main(["bench", "window", *options, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [line.split(" | ") for line in printed.splitlines() if line.startswith("| ")]
    names = (*COMMITTING_CASES, *COMMITTING_GRAMMARS)
    constructed = [row for row in rows if row[0].strip("| ").startswith(names)]
    assert len(constructed) == 3
    for row in constructed:
        assert row[3] == row[2] == "2"  # every output complete with the sized window
    assert json.loads((out / "bench_window.json").read_text())["results"]
    assert (out / "bench_window.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_an_unknown_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "nothing"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_bench_compliance_is_wired_to_the_compliance_runner(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    assert main(["bench", "compliance", str(missing), "--out", str(tmp_path / "out")]) == 1
    assert str(missing) in capsys.readouterr().err


def test_bench_readme_splices_each_summary_between_its_markers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# T\n<!-- bench:apply -->\nold apply\n<!-- /bench:apply -->\nmiddle\n"
        "<!-- bench:e2e -->\nold e2e\n<!-- /bench:e2e -->\nend\n"
    )
    results = tmp_path / "bench-out"
    (results / "apply").mkdir(parents=True)
    (results / "apply" / "summary.md").write_text("| new | apply |\n")
    args = ["bench", "readme", "--readme", str(readme), "--results", str(results)]
    assert main(args) == 0
    assert readme.read_text() == (
        "# T\n<!-- bench:apply -->\n| new | apply |\n<!-- /bench:apply -->\nmiddle\n"
        "<!-- bench:e2e -->\nold e2e\n<!-- /bench:e2e -->\nend\n"
    )
    assert "updated apply" in capsys.readouterr().out
    (results / "compliance").mkdir()
    (results / "compliance" / "misses.md").write_text(
        "# x\n## xgrammar: 1 not covered\n- a\n## auto: 2 not covered\n- b\n- c\n"
    )
    assert main(args) == 0
    doc = (tmp_path / "docs" / "compliance-misses.md").read_text()
    assert doc.endswith("## auto: 2 not covered\n- b\n- c\n") and "## xgrammar" not in doc
    (results / "decoder").mkdir()
    (results / "decoder" / "summary.md").write_text("x\n")  # no decoder block in this README
    assert main(args) == 1
    assert "bench:decoder" in capsys.readouterr().err
