"""``guidedec bench``: each benchmark runs behind the one command."""

from __future__ import annotations

import pytest

from guidedec.cli import main


def test_bench_apply_runs_the_apply_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "apply", "--batches", "1", "--repeats", "2", "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "guidedec cpu" in out and "xgrammar cpu" in out


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
