"""``guidedec bench compliance`` on a tiny slice: outputs, per-schema records, consistent counts,
a hand-made subset every backend covers, a malformed schema counted as a compile failure, and a
forced worker crash counted without ending the run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA, missing_data
from guidedec.bench.compliance import main
from guidedec.bench.compliance_evaluator import BACKENDS
from guidedec.bench.compliance_worker import ALL, CRASH_ENV

pytestmark = pytest.mark.data
JME = DATA / "jsonschemabench" / "JME.jsonl"
SUITE_FILE = DATA / "json-schema-test-suite" / "tests" / "draft2020-12" / "maxLength.json"

GOOD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}
GOOD = [
    {
        "file": "good",
        "schema": GOOD_SCHEMA,
        "tests": [
            {"data": {"a": 1}, "valid": True},
            {"data": {"a": "x"}, "valid": False},
            {"data": {}, "valid": False},
        ],
    }
]
BAD = [
    {
        "file": "malformed",
        "schema": {"type": "no-such-type"},
        "tests": [{"data": 1, "valid": True}],
    },
    {"file": "crash_me", "schema": GOOD_SCHEMA, "tests": [{"data": {"a": 2}, "valid": True}]},
]
# xgrammar ignores ``not``: random outputs often write a string this short, and llguidance refuses.
APPROX = [
    {
        "file": "short_words",
        "schema": {
            "type": "object",
            "properties": {"w": {"type": "string", "not": {"maxLength": 3}}},
            "required": ["w"],
            "additionalProperties": False,
        },
        "tests": [{"data": {"w": "abcd"}, "valid": True}, {"data": {"w": "ab"}, "valid": False}],
    }
]
RECORD_FIELDS = {
    "compiled",
    "error",
    "compile_s",
    "killed",
    "false_negatives",
    "false_positives",
    "covered",
    "mask_fills",
    "mask_us_mean",
    "gen_outputs",
    "gen_terminated",
    "gen_valid",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    for path in (JME, SUITE_FILE):
        if not path.exists():
            missing_data(path)
    tmp = tmp_path_factory.mktemp("compliance")
    for name, items in (("good", GOOD), ("bad", BAD), ("approx", APPROX)):
        (tmp / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in items) + "\n")
    suite = tmp / "suite"
    suite.mkdir()
    shutil.copy(SUITE_FILE, suite / SUITE_FILE.name)
    out = tmp / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CRASH_ENV, "crash_me")
        code = main(
            [
                str(JME),
                str(tmp / "good.jsonl"),
                str(tmp / "bad.jsonl"),
                str(tmp / "approx.jsonl"),
                str(suite),
                "--limit",
                "3",
                "--out",
                str(out),
            ]
        )
    assert code == 0
    payload = json.loads((out / "compliance.json").read_text())
    return out, payload, (out / "summary.md").read_text()


def records(payload: dict[str, Any], subset: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r["backends"] for r in payload["schemas"] if r["subset"] == subset}


def test_outputs_exist(run: tuple[Path, dict[str, Any], str]) -> None:
    out, payload, summary = run
    assert (out / "workers.log").exists()  # the backends' own warnings go there
    for name in ("summary.md", "misses.md", "compliance.json", "coverage.png", "mask_times.png"):
        assert (out / name).stat().st_size > 0, name
    assert set(payload["summary"]) == {"JME", "good", "bad", "approx", "suite", "all"}
    assert summary.startswith("| subset | backend |")
    assert "| good | auto | 1 | 1 | 100.0 | 0 | 0 |" in summary


def test_records_and_counts(run: tuple[Path, dict[str, Any], str]) -> None:
    _, payload, _ = run
    assert (
        len(payload["schemas"]) == 3 + 1 + 2 + 1 + 2
    )  # JME --limit 3, good 1, bad 2, approx 1, maxLength's 2 groups
    for rec in payload["schemas"]:
        assert set(rec["backends"]) == set(ALL)
        for result in rec["backends"].values():
            assert set(result) >= RECORD_FIELDS
            assert result["covered"] <= result["compiled"]
            assert result["gen_valid"] <= result["gen_terminated"] <= result["gen_outputs"]
    for summary in payload["summary"].values():
        for name in ALL:
            s = summary[name]
            assert 0 <= s["covered"] <= s["compiled"] <= s["schemas"]
    jme = payload["summary"]["JME"]
    assert all(jme[name]["compiled"] == 3 for name in ALL)
    assert all(jme[name]["mask_us"]["n"] > 0 for name in ALL)


def test_hand_made_subsets(run: tuple[Path, dict[str, Any], str]) -> None:
    _, payload, _ = run
    good, bad = records(payload, "good")["good"], records(payload, "bad")
    for name in ALL:
        assert good[name]["compiled"] and good[name]["covered"], (name, good[name])
        assert good[name]["false_negatives"] == good[name]["false_positives"] == 0
        assert good[name]["gen_outputs"] > 0
        assert payload["summary"]["good"][name]["coverage_pct"] == 100.0
        malformed = bad["malformed"][name]
        assert not malformed["compiled"] and malformed["error"] and not malformed["killed"]
        crashed = bad["crash_me"][name]
        assert crashed["killed"] == "crash" and not crashed["compiled"], crashed
        summary = payload["summary"]["bad"][name]
        assert (summary["compiled"], summary["covered"], summary["crashes"]) == (0, 0, 1)


def test_bad_data_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "out")]) == 1
    assert "missing.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(JME), "--backend", "nope"])


def test_auto_against_the_better_of_two(run: tuple[Path, dict[str, Any], str]) -> None:
    _, payload, summary = run
    for subset, s in payload["summary"].items():
        versus = s["auto_vs_better"]
        schemas = [r for r in payload["schemas"] if subset in ("all", r["subset"])]
        better = [r for r in schemas if any(r["backends"][b]["covered"] for b in BACKENDS)]
        assert versus["better_of_two"] == len(better)
        assert versus["auto"] == s["auto"]["covered"]
        below = [r["name"] for r in better if not r["backends"]["auto"]["covered"]]
        assert versus["auto_below_better"] == below
    assert "| good | 1 | 1 | 1 | 1 | 1 | none |" in summary


def test_misses_list_every_uncovered_schema_with_its_cause(
    run: tuple[Path, dict[str, Any], str],
) -> None:
    out, payload, _ = run
    misses = (out / "misses.md").read_text()
    for name in ALL:
        section = misses.split(f"## {name}:")[1].split("\n## ")[0]
        uncovered = [r for r in payload["schemas"] if not r["backends"][name]["covered"]]
        assert section.startswith(f" {len(uncovered)} not covered")
        for r in uncovered:
            assert f"{r['subset']} `{r['name']}`" in section
        assert "`malformed`" in section and "compile: " in section
        assert "worker died" in section  # the forced crash, with its cause


def test_model_generations_with_the_reference_engine(tmp_path: Path) -> None:
    data = tmp_path / "good.jsonl"
    data.write_text(json.dumps(GOOD[0]) + "\n")
    out = tmp_path / "out"
    args = [str(data), "--backend", "xgrammar", "--model", "tiny-random", "--out", str(out)]
    assert main(args) == 0
    payload = json.loads((out / "compliance.json").read_text())
    result = payload["schemas"][0]["backends"]["xgrammar"]
    assert result["model_outputs"] == 2
    assert result["model_valid"] == result["model_terminated"] - result["model_unchecked"]
    summary = payload["summary"]["good"]["xgrammar"]
    assert summary["model_outputs"] == 2
    assert summary["model_terminated"] >= 1  # seeded: the greedy output stops
    assert summary["model_compliance_pct"] == 100.0
    assert "| good | xgrammar | 2 |" in (out / "summary.md").read_text()


def test_generation_with_the_engine_defaults(run: tuple[Path, dict[str, Any], str]) -> None:
    """Generation runs with the backend alone and with the engine's defaults: on a schema
    xgrammar approximates, some outputs stop invalid alone, none do with the defaults (steering
    rewrites or the final check ends them), and the summary reports both."""
    _, payload, summary = run
    for name in ("xgrammar", "auto"):
        s = payload["summary"]["approx"][name]
        assert s["gen_plain_invalid"] > 0, s
        assert s["gen_terminated"] == s["gen_valid"], s
        assert s["gen_steered"] + s["gen_caught"] > 0, s
        assert s["gen_us_per_token"] > 0 and s["gen_plain_us_per_token"] > 0
    assert "| subset | backend | stopped invalid, backend alone |" in summary
    assert payload["summary"]["approx"]["llguidance"]["compiled"] == 0
