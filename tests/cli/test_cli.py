"""``guidedec generate`` (and ``demo``), run in-process on ``tiny-random``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from guidedec import GuideType
from guidedec.cli import build_parser, main
from guidedec.cli_generate import GRAMMAR_ERROR_STATUS, load_guide, sampling_params

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "examples" / "person.schema.json"
LINE = re.compile(r"^\[(\d+)\] (stop|length|grammar_error|abort): (.*)$")
SUMMARY = re.compile(
    r"guidedec: (\d+) prompts?, (\d+) generated tokens? in [\d.]+ s \([\d.]+ tokens/s\); "
    r"guided overhead [\d.]+% "
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``guidedec`` with ``argv``: (exit status, stdout, stderr); argparse exits count too."""
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return status, out, err


def outputs(stdout: str) -> list[tuple[int, str, str]]:
    """The ``[i] finish_reason: text`` lines of plain output, as (i, reason, text)."""
    return [(int(m[1]), m[2], m[3]) for line in stdout.splitlines() if (m := LINE.match(line))]


# --- runs of the model (each builds a tiny-random engine, ~2-3 s) -----------------------------


def test_json_schema_file_outputs_validate(capsys: pytest.CaptureFixture[str]) -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    argv = ["generate", "--json-schema", str(SCHEMA_FILE), "--whitespace", "compact"]
    status, out, err = run_cli(capsys, *argv, "--max-tokens", "96", "A person:", "A user:")
    assert status == 0, err
    results = outputs(out)
    assert [i for i, _, _ in results] == [0, 1]
    for _, reason, text in results:
        assert reason == "stop", out  # closed within --max-tokens
        jsonschema.validate(json.loads(text), schema)
    assert out.count("    schema: valid") == 2
    summary = SUMMARY.search(err)
    assert summary is not None and summary[1] == "2", err


def test_regex_jsonl_records(capsys: pytest.CaptureFixture[str]) -> None:
    pattern = r"[a-z]{1,4}@x\.io"
    prompts = [f"email {i}:" for i in range(5)]  # 5 prompts: the progress bar runs (on stderr)
    argv = ["generate", "--regex", pattern, "--max-tokens", "16", "--jsonl", *prompts]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    records = [json.loads(line) for line in out.splitlines()]  # every stdout line is JSON
    assert [r["prompt"] for r in records] == prompts
    for r in records:
        assert set(r) == {
            "prompt",
            "text",
            "token_ids",
            "finish_reason",
            "error",
            "incomplete",
            "closed_from",
            "timings",
        }
        assert r["incomplete"] is None
        # By itself, or closed within its 16 tokens (length, with where the budget took over).
        complete = r["finish_reason"] == "stop" or isinstance(r["closed_from"], int)
        assert complete and r["error"] is None, r
        assert re.fullmatch(pattern, r["text"], re.ASCII)
        assert r["token_ids"] and all(isinstance(t, int) for t in r["token_ids"])
        timings = r["timings"]
        assert 0 < timings["ttft_s"] <= timings["e2e_s"]
    assert re.search(r"\b80/80 \[.*tok/s", err), err  # the progress bar counts tokens: 5 x 16
    assert SUMMARY.search(err) is not None
    assert "tiny-random has random weights" in err


@pytest.mark.parametrize("close", [True, False])
def test_closing_within_max_tokens_or_an_incomplete_note(
    capsys: pytest.CaptureFixture[str], close: bool
) -> None:
    schema = '{"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}'
    argv = ["generate", "--json-schema", schema, "--temperature", "1", "--seed", "3"]
    argv += ["--max-tokens", "12", "--jsonl"] + ([] if close else ["--no-close-within-budget"])
    status, out, err = run_cli(capsys, *argv, "Note:", "Another:")
    assert status == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    if close:  # 12 tokens: closing ends the random model's string, and says where it took over
        assert any(r["finish_reason"] == "length" for r in records), records
    for record in records:
        if close:
            assert record["incomplete"] is None
            if record["finish_reason"] == "length":
                assert 0 < record["closed_from"] < len(record["text"])
            else:
                assert record["finish_reason"] == "stop" and record["closed_from"] is None
            assert isinstance(json.loads(record["text"])["note"], str)
        else:
            assert record["finish_reason"] == "length", record  # a random model's string
            assert "closing off" in record["incomplete"]


def test_choice_outputs_one_of_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    choices = ["alpha", "beta", "gamma delta"]
    prompts = ["Pick one:", "Another:", "Third:"]
    picks = [arg for choice in choices for arg in ("--choice", choice)]
    argv = ["generate", "--temperature", "1", "--seed", "7", *picks]  # the prompts follow
    status, out, err = run_cli(capsys, *argv, *prompts)
    assert status == 0, err
    results = outputs(out)
    assert len(results) == 3
    assert all(reason == "stop" and text in choices for _, reason, text in results), out


def test_ebnf_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    grammar = tmp_path / "answer.ebnf"
    grammar.write_text('root ::= ("yes" | "no") " " [0-9]\n', encoding="utf-8")
    status, out, err = run_cli(capsys, "generate", "--ebnf", str(grammar), "Answer:")
    assert status == 0, err
    [(_, reason, text)] = outputs(out)
    assert reason == "stop" and re.fullmatch(r"(yes|no) [0-9]", text), out


def test_an_invalid_regex_is_reported_and_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    """Every output is printed, with its error, and the exit status says one failed."""
    status, out, err = run_cli(capsys, "generate", "--regex", "[", "first", "second")
    assert status == GRAMMAR_ERROR_STATUS == 3, err
    assert "2 output(s) ended in grammar_error" in err
    results = outputs(out)
    assert [(i, reason) for i, reason, _ in results] == [(0, "grammar_error"), (1, "grammar_error")]
    errors = [line for line in out.splitlines() if line.startswith("    error: ")]
    assert len(errors) == 2 and all("regex" in line for line in errors), out
    assert "grammar_error 2" in err


# --- argument and file errors (no model is built) -------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "--regex", "a", "p"],  # two guides
        ["--choice", "a", "--json-schema", "{}", "p"],
        ["--temperature", "-1", "p"],
        ["--top-p", "0", "p"],
        ["--max-tokens", "0", "p"],
        ["--speculative", "medusa", "p"],
        [""],  # an empty prompt
        [],  # no prompt
    ],
)
def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    status, out, err = run_cli(capsys, "generate", *argv)
    assert status == 2 and out == ""
    assert "error:" in err


@pytest.mark.parametrize("option", ["--json-schema", "--ebnf", "--lark", "--structural-tag"])
def test_a_missing_file_exits_1_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str
) -> None:
    missing = tmp_path / "nowhere" / "guide.txt"
    status, out, err = run_cli(capsys, "generate", option, str(missing), "p")
    assert status == 1 and out == ""
    assert str(missing) in err and "not found" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"type": ', "is not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"type": "strnig"}', "is not a valid JSON schema"),
    ],
)
def test_an_invalid_schema_file_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    status, _, err = run_cli(capsys, "generate", "--json-schema", str(path), "p")
    assert status == 1
    assert message in err and str(path) in err


def test_an_unknown_model_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run_cli(capsys, "generate", "--model", str(tmp_path), "p")
    assert status == 1
    assert "cannot start the engine" in err and str(tmp_path) in err


# --- guides and sampling parameters from the arguments ----------------------------------------


def test_guides_from_files_and_inline(tmp_path: Path) -> None:
    (tmp_path / "g.ebnf").write_text('root ::= "a"', encoding="utf-8")
    (tmp_path / "g.lark").write_text('start: "a"', encoding="utf-8")
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "a"}}
    (tmp_path / "tag.json").write_text(json.dumps(tag), encoding="utf-8")
    cases = {
        ("--ebnf", str(tmp_path / "g.ebnf")): (GuideType.EBNF, 'root ::= "a"'),
        ("--lark", str(tmp_path / "g.lark")): (GuideType.LARK, 'start: "a"'),
        ("--structural-tag", str(tmp_path / "tag.json")): (GuideType.STRUCTURAL_TAG, None),
        ("--json-schema", ' {"type": "integer"}'): (GuideType.JSON_SCHEMA, None),
        ("--json",): (GuideType.JSON_OBJECT, None),
        ("--choice", "x", "--choice", "y"): (GuideType.CHOICE, ("x", "y")),
    }
    for options, (guide_type, text) in cases.items():
        args = build_parser().parse_args(["generate", *options, "--", "p"])
        params = load_guide(args).params
        assert params is not None and params.guide_type is guide_type, options
        assert text is None or params.guide == text
    unguided = build_parser().parse_args(["generate", "p"])
    assert load_guide(unguided).params is None


def test_seed_s_gives_prompt_i_seed_s_plus_i() -> None:
    parse = build_parser().parse_args
    args = parse(["generate", "--seed", "10", "--temperature", "0.5", "--top-k", "3", "a", "b"])
    params = sampling_params(args, load_guide(args))
    assert [p.seed for p in params] == [10, 11]
    assert all(p.temperature == 0.5 and p.top_k == 3 for p in params)
    unseeded = parse(["generate", "a", "b"])
    assert [p.seed for p in sampling_params(unseeded, load_guide(unseeded))] == [None, None]


# --- the other entry points -------------------------------------------------------------------


def test_random_logits_demo_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "demo", "--count", "2", "--schema", str(SCHEMA_FILE))
    assert status == 0
    assert out.count(", valid\n") == 2


def test_python_m_guidedec_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "guidedec", "generate", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0
    assert "--json-schema" in result.stdout and "PROMPT" in result.stdout


def test_summary_names_how_auto_fills_the_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """Four guided prompts on one backend make waves of 4 rows: ``auto`` measures them, and the
    summary says what it settled on (or that it is still measuring)."""
    argv = ["generate", "--backend", "llguidance", "--max-num-seqs", "4", "--max-tokens", "16"]
    guide = ["--regex", "[a-z]{1,20}"]
    status, _, err = run_cli(capsys, *argv, *guide, "a", "b", "c", "d")
    assert status == 0, err
    assert re.search(r"fills: llguidance 4\+ (parallel|sequential|measuring)", err), err


def test_jump_forward_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The same text with and without ``--jump-forward``; the summary counts the forced
    tokens."""
    guide = ["generate", "--choice", "international shipping please", "--choice", "domestic pickup"]
    argv = ["--backend", "llguidance", "--max-tokens", "120", "--jsonl"]
    status, plain, err = run_cli(capsys, *guide, *argv, "Ship:")
    assert status == 0, err
    status, jumped, err = run_cli(capsys, *guide, *argv, "--jump-forward", "Ship:")
    assert status == 0, err
    assert json.loads(jumped)["text"] == json.loads(plain)["text"]
    assert re.search(r"jump-forward: [1-9]\d* of [1-9]\d* forced tokens accepted", err), err


def test_stop_strings_and_a_reasoning_model_from_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--stop`` cuts the text; ``--reasoning-parser`` leaves the thinking free (its tokens
    capped by ``--thinking-token-budget``) and guides what follows ``</think>``."""
    status, out, err = run_cli(capsys, "generate", "--max-tokens", "12", "--jsonl", "Once")
    text = json.loads(out)["text"]
    stop = text[5:8]
    status, out, err = run_cli(
        capsys, "generate", "--max-tokens", "12", "--jsonl", "--stop", stop, "Once"
    )
    assert status == 0, err
    assert json.loads(out)["text"] == text[: text.index(stop)]
    argv = ["generate", "--reasoning-parser", "deepseek_r1", "--thinking-token-budget", "5"]
    status, out, err = run_cli(capsys, *argv, "--regex", "[0-9]{3}", "--jsonl", "Think:")
    assert status == 0, err
    record = json.loads(out)
    assert re.fullmatch("[0-9]{3}", record["text"]) and record["finish_reason"] == "stop"
    assert record["reasoning"] and 128822 in record["token_ids"]  # </think>
    assert record["token_ids"].index(128822) == 5


def test_think_first_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``--think-first``: the free text is the record's reasoning, the text the value; with
    another guide it is refused, naming the option."""
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    argv = [
        "generate",
        "--json-schema",
        schema,
        "--think-first",
        "--temperature",
        "1",
        "--seed",
        "0",
    ]
    status, out, err = run_cli(capsys, *argv, "--max-tokens", "40", "--jsonl", "Think:")
    assert status == 0, err
    record = json.loads(out)
    assert isinstance(json.loads(record["text"])["n"], int)
    assert record["reasoning"] and "{" not in record["reasoning"]
    status, out, err = run_cli(capsys, "generate", "--regex", "a+", "--think-first", "Hi")
    assert status != 0 and "--think-first goes with --json-schema or --json" in err
    status, out, err = run_cli(
        capsys, "generate", "--json-schema", '{"type": "string"}', "--think-first", "Hi"
    )
    assert status != 0 and "an object or an array" in err


@pytest.mark.parametrize("flag", [None, "--no-disable-additional-properties"])
def test_objects_are_closed_unless_the_command_line_says_not(
    capsys: pytest.CaptureFixture[str], flag: str | None
) -> None:
    """By default an object that names its properties gets no others (the engine's
    ``disable_additional_properties``); ``--no-disable-additional-properties`` keeps the
    schema's language, where a random model at temperature 1 writes keys of its own."""
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    argv = ["generate", "--json-schema", schema, "--whitespace", "compact", "--jsonl"]
    argv += ["--temperature", "1", "--seed", "0", "--max-tokens", "48"]
    prompts = [f"Object {i}:" for i in range(8)]
    status, out, err = run_cli(capsys, *argv, *([flag] if flag else []), *prompts)
    assert status == 0, err
    keys = set()
    for line in out.splitlines():
        keys |= set(json.loads(json.loads(line)["text"]))
    assert (keys <= {"a"}) is (flag is None), keys


def test_export_model_writes_a_folder_that_loads_as_the_same_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """transformers loads the folder offline: the same tokens and, float32, the same logits."""
    import torch
    import transformers

    from guidedec.engine.model import load_model

    status, out, err = run_cli(capsys, "export-model", "tiny-random", str(tmp_path / "m"))
    assert status == 0, err
    assert "wrote tiny-random" in out
    original = load_model("tiny-random")
    exported = load_model(str(tmp_path / "m"))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "m")
    text = 'A person: {"name": "Ada"} <think>'
    assert hf.encode(text) == original.tokenizer.hf_tokenizer.encode(text)
    assert exported.tokenizer.vocab_size == original.tokenizer.vocab_size
    ids = torch.tensor([original.tokenizer.encode(text)])
    with torch.no_grad():
        assert torch.equal(original.model(ids).logits, exported.model(ids).logits)


def test_chat_template_file_renders_the_chat(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A template that renders the message's text alone makes ``--chat`` generate what the raw
    prompt does (greedy); a value that is neither a file nor a template is an error naming it."""
    template = tmp_path / "bare.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    argv = ["generate", "--temperature", "0", "--max-tokens", "8", "--jsonl"]
    status, raw, err = run_cli(capsys, *argv, "Pick one:")
    assert status == 0, err
    chat_argv = [*argv, "--chat", "--chat-template", str(template)]
    status, chat, err = run_cli(capsys, *chat_argv, "Pick one:")
    assert status == 0, err
    assert json.loads(chat)["token_ids"] == json.loads(raw)["token_ids"]
    status, default, err = run_cli(capsys, *argv, "--chat", "Pick one:")
    assert status == 0, err
    assert json.loads(default)["token_ids"] != json.loads(raw)["token_ids"]  # <|user|> headers
    status, _, err = run_cli(capsys, *argv, "--chat", "--chat-template", "nope.jinja", "x")
    assert status != 0 and "--chat-template" in err and "nope.jinja" in err
