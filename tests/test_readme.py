"""The README's examples run as written: its Python blocks, its command-line block, and its
client example against the server its serve command starts."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NEEDS_SERVER = "# (needs the server above)"
COMMAND_S = 120  # each command, model start included: seconds on this machine


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def _env() -> dict[str, str]:
    """``guidedec`` on PATH, as after ``source .venv/bin/activate``; no hub."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "HF_HUB_OFFLINE": "1"}


def test_readme_python_examples_run() -> None:
    blocks = _blocks("python")
    assert len(blocks) >= 2
    namespace: dict[str, object] = {}
    for block in blocks:
        if block.startswith(NEEDS_SERVER):
            continue  # run against a live server below
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["failed"] == []
    assert isinstance(namespace["matcher"].is_terminated(), bool)  # type: ignore[attr-defined]


def test_readme_first_example_extracts_the_facts_it_says() -> None:
    """The first example runs the real model and prints what its comment says."""
    namespace: dict[str, object] = {}
    exec(compile(_blocks("python")[0], str(README), "exec"), namespace)
    out = namespace["out"]
    assert out.finish_reason == "stop"  # type: ignore[attr-defined]
    facts = json.loads(out.text)  # type: ignore[attr-defined]
    assert facts == {"name": "Maria Lopez", "age": 34, "city": "Lisbon"}


def test_readme_opens_with_the_two_setup_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    commands = [line.split("#")[0].strip() for line in lines[:8] if line.startswith("make ")]
    assert commands == ["make demo", "make test"]


def test_readme_command_lines_run() -> None:
    commands = [
        line
        for block in _blocks("bash")
        for line in block.splitlines()
        if line.startswith("guidedec generate")
    ]
    assert len(commands) >= 3
    for command in commands:
        start = time.monotonic()
        done = subprocess.run(
            shlex.split(command),
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_S,
        )
        assert done.returncode == 0, (command, done.stderr[-2000:])
        assert done.stdout.strip(), command
        assert time.monotonic() - start < COMMAND_S


def test_readme_client_example_against_its_server() -> None:
    """The serve command as written (on a free port), then the client block, which must return
    in seconds: a chat request without ``max_tokens`` ends within the server's default."""
    [serve] = [
        line for block in _blocks("bash") for line in block.splitlines() if "guidedec serve" in line
    ]
    [client] = [b for b in _blocks("python") if b.startswith(NEEDS_SERVER)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    argv = [port if arg == "8000" else arg for arg in shlex.split(serve)]
    server = subprocess.Popen(
        argv, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + COMMAND_S
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the README's server did not start"
            time.sleep(0.2)
        namespace: dict[str, object] = {}
        start = time.monotonic()
        exec(compile(client.replace(":8000/", f":{port}/"), str(README), "exec"), namespace)
        assert time.monotonic() - start < 60
        out = namespace["out"]
        content = out.choices[0].message.content  # type: ignore[attr-defined]
        assert json.loads(content) == {"name": "Maria Lopez", "age": 34}  # as its comment says
    finally:
        server.terminate()
        server.wait(timeout=30)
