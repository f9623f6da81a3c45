"""Compile isolation: a guide that crashes a backend, hangs it or eats memory fails alone; the
process and every other guide go on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.errors import GrammarError
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.isolation import PRELOAD, PRELOAD_DEFAULT, CompileIsolation
from guidedec.grammar.limits import GuideLimits
from guidedec.tokenizer import TokenizerInfo

NESTED_PATTERN = {"type": "string", "pattern": "^" + "(" * 30000 + "a" + ")" * 30000 + "$"}
MANY_REQUIRED = {"type": "object", "required": [f"k{i}" for i in range(30000)]}
REF_CHAIN = {
    "$ref": "#/$defs/d0",
    "$defs": {
        **{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(3000)},
        "d3000": {"type": "integer"},
    },
}
HEALTHY = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}
SLOW_CHOICE = [f"option number {i}" for i in range(100_000)]
# The guide limits would refuse the guides above before any backend: lifted here, so that
# isolation is what stands between them and the process.
LOOSE = GuideLimits(
    max_names=10**6,
    max_values=10**7,
    max_pattern_chars=10**7,
    max_group_depth=10**6,
    max_ref_chain=10**6,
)


@pytest.fixture(scope="module")
def isolation() -> Iterator[CompileIsolation]:
    iso = CompileIsolation(timeout_s=30.0)  # a crash comes well within it, even on a busy CPU
    iso.start(GuidedDecodingConfig(tokenizer=TokenizerInfo.default()))
    yield iso
    iso.close()


def _factory(backend: str, isolation: CompileIsolation) -> Any:
    config = GuidedDecodingConfig(
        backend=backend,  # type: ignore[arg-type]
        tokenizer=TokenizerInfo.default(),
        limits=LOOSE,
    )
    return create_grammar_matcher_factory(config, isolation=isolation)


@pytest.mark.parametrize(
    ("backend", "schema"),
    [("xgrammar", NESTED_PATTERN), ("llguidance", MANY_REQUIRED), ("llguidance", REF_CHAIN)],
    ids=["xgrammar nested groups", "llguidance 30k required", "llguidance $ref chain"],
)
def test_a_backend_crash_fails_that_guide_alone(
    backend: str, schema: dict[str, Any], isolation: CompileIsolation
) -> None:
    """These crash the backend's native code in-process (signal 11); isolated, the guide gets a
    GrammarError that says so, and the same factory compiles the next guide."""
    factory = _factory(backend, isolation)
    with pytest.raises(GrammarError, match=r"crashed compiling this guide \(signal 11\)"):
        factory.create(GuidedDecodingParams(json_schema=schema))
    matcher = factory.create(GuidedDecodingParams(json_schema=HEALTHY))
    assert not matcher.is_terminated()


def test_a_compile_past_its_deadline_is_stopped() -> None:
    """A 100k-option choice takes xgrammar far longer than a 2 s deadline: the probe fails at
    the deadline and its worker is killed (its CPU freed), not left running."""
    isolation = CompileIsolation(timeout_s=2.0)
    isolation.start(GuidedDecodingConfig(tokenizer=TokenizerInfo.default()))
    factory = _factory("xgrammar", isolation)
    start = time.monotonic()
    with pytest.raises(GrammarError, match="timed out after 2 s"):
        factory.create(GuidedDecodingParams(choice=SLOW_CHOICE))
    assert time.monotonic() - start < 2.0 + 1.0
    pool = isolation._pool
    assert pool is not None
    assert all(w.process.is_alive() for w in pool._idle)  # the killed one is not kept
    factory.create(GuidedDecodingParams(choice=["yes", "no"]))
    isolation.close()


def test_auto_falls_back_when_a_backend_crashes(isolation: CompileIsolation) -> None:
    """``auto`` tries llguidance first for 30k required names; its crash counts as a refusal
    and xgrammar compiles the schema."""
    factory = _factory("auto", isolation)
    matcher = factory.create(GuidedDecodingParams(json_schema=MANY_REQUIRED))
    assert matcher.backend == "xgrammar"


def test_probes_are_bounded() -> None:
    """One worker and no queue: a probe that arrives while another runs fails at once."""
    iso = CompileIsolation(timeout_s=3.0, num_workers=1, max_queued=0)
    config = GuidedDecodingConfig(backend="xgrammar", tokenizer=TokenizerInfo.default())
    iso.start(config)
    factory = _factory("xgrammar", iso)
    errors: list[str] = []

    def slow() -> None:
        try:
            factory.create(GuidedDecodingParams(choice=SLOW_CHOICE))
        except GrammarError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)
    with pytest.raises(GrammarError, match="too many guides compiling"):
        factory.create(GuidedDecodingParams(regex="[a-z]+"))
    thread.join()
    assert errors and "timed out" in errors[0]
    iso.close()


def test_a_worker_past_its_memory_limit_fails_that_guide_alone() -> None:
    """With 64 MB of room a worker cannot compile a 100k-option choice: the guide fails, the
    next one compiles."""
    iso = CompileIsolation(timeout_s=30.0, memory_limit_bytes=64 << 20)
    factory = _factory("xgrammar", iso)
    with pytest.raises(GrammarError):
        factory.create(GuidedDecodingParams(choice=SLOW_CHOICE))
    factory.create(GuidedDecodingParams(choice=["yes", "no"]))
    iso.close()


def test_llm_serves_a_healthy_request_beside_a_hostile_one() -> None:
    """Through ``LLM.generate``: the crashing guide's request ends ``grammar_error``, and the
    healthy request beside it gives the same output as alone."""
    llm = LLM("tiny-random", max_num_seqs=2, compile_timeout_s=10, guide_limits=LOOSE)
    healthy = SamplingParams(
        max_tokens=16, guided_decoding=GuidedDecodingParams(json_schema=HEALTHY)
    )
    hostile = SamplingParams(
        max_tokens=16, guided_decoding=GuidedDecodingParams(json_schema=NESTED_PATTERN)
    )
    alone = llm.generate(["Write:"], [healthy])[0]
    broken, beside = llm.generate(["Oops:", "Write:"], [hostile, healthy])
    assert broken.finish_reason == "grammar_error"
    assert "crashed" in (broken.error or "")
    assert beside.token_ids == alone.token_ids and beside.finish_reason == alone.finish_reason
    llm.close()


def test_a_script_without_a_main_guard(tmp_path: Any) -> None:
    """Workers never run the caller's script again (``multiprocessing`` would, for a script
    that builds an engine at its top level)."""
    script = tmp_path / "top_level.py"
    script.write_text(
        textwrap.dedent(
            """
            from guidedec import GuidedDecodingParams
            from guidedec.grammar.config import GuidedDecodingConfig
            from guidedec.grammar.factory import create_grammar_matcher_factory
            from guidedec.grammar.isolation import CompileIsolation
            from guidedec.tokenizer import TokenizerInfo

            print("top level ran")
            iso = CompileIsolation(timeout_s=30)
            config = GuidedDecodingConfig(tokenizer=TokenizerInfo.default())
            factory = create_grammar_matcher_factory(config, isolation=iso)
            factory.create(GuidedDecodingParams(regex="[ab]+"))
            factory.close()
            print("compiled")
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["top", "level", "ran", "compiled"]


def test_the_cache_counts_what_an_llguidance_guide_holds(isolation: CompileIsolation) -> None:
    """llguidance reports no size; the probe worker measures the heap the compiled guide and
    its first mask took, and the compile cache counts that instead of an estimate from the
    grammar's 60 characters."""
    guide = GuidedDecodingParams(lark="start: /((a{100}){100}){7}/")
    factory = _factory("llguidance", isolation)
    report = isolation.probe("llguidance", guide, factory.config)
    assert report.heap_bytes is not None and report.heap_bytes > 10_000_000
    factory.create(guide)
    assert factory.cache.stats().size_bytes >= report.heap_bytes // 2
    unmeasured = _factory("llguidance", None)  # type: ignore[arg-type]
    unmeasured.create(guide)
    assert unmeasured.cache.stats().size_bytes < 1_000_000


def test_a_slow_first_mask_does_not_count_as_compile_time(isolation: CompileIsolation) -> None:
    """llguidance compiles a nested Lark repetition in milliseconds and builds its lexer over
    the first mask (seconds). The probe holds only the compile against the deadline (the caller
    compiles again, and fills the first mask later, under the mask-time limit): such a guide is
    not refused as a compile that would pass the timeout."""
    guide = GuidedDecodingParams(lark="start: /(a{700}){700}/")
    factory = _factory("llguidance", isolation)
    start = time.monotonic()
    report = isolation.probe("llguidance", guide, factory.config)
    took = time.monotonic() - start
    assert took > 0.5  # the first mask is slow...
    assert report.seconds < took / 4  # ...and is not counted as compiling


@pytest.mark.parametrize(
    ("preload", "builds_default"),
    [(PRELOAD, False), (PRELOAD_DEFAULT, True)],
)
def test_the_fork_server_builds_the_default_tokenizer_only_for_engines_on_it(
    preload: str, builds_default: bool
) -> None:
    script = textwrap.dedent(f"""
        import importlib, sys
        importlib.import_module({preload!r})
        from guidedec import tokenizer
        assert "guidedec.grammar.xgrammar_backend" in sys.modules
        assert "guidedec.grammar.llguidance_backend" in sys.modules
        print(tokenizer._default_tokenizer_info.cache_info().currsize)
    """)
    command = [sys.executable, "-c", script]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("1" if builds_default else "0")


def test_a_worker_probes_with_the_engine_s_own_tokenizer() -> None:
    own = TokenizerInfo.from_huggingface(TokenizerInfo.default().hf_tokenizer, vocab_size=129_312)
    iso = CompileIsolation(timeout_s=60.0)
    config = GuidedDecodingConfig(backend="xgrammar", tokenizer=own)
    try:
        report = iso.probe("xgrammar", GuidedDecodingParams(regex="[0-9]{3}"), config)
        assert report.seconds >= 0
        with pytest.raises(GrammarError):
            iso.probe("xgrammar", GuidedDecodingParams(regex="(unclosed"), config)
    finally:
        iso.close()


def test_a_worker_builds_its_tokenizer_views_before_its_memory_limit() -> None:
    """A fork server started for another tokenizer has not built the default one's views: a
    worker builds them before its memory limit applies, so 64 MB of room still compiles a small
    guide (under the limit, the build hung the worker, and the probe's send with it)."""
    script = textwrap.dedent("""
        from guidedec.grammar.config import GuidedDecodingConfig
        from guidedec.grammar.isolation import CompileIsolation
        from guidedec.grammar.params import GuidedDecodingParams
        from guidedec.tokenizer import TokenizerInfo

        default = TokenizerInfo.default()
        own = TokenizerInfo.from_huggingface(default.hf_tokenizer, vocab_size=129_312)
        first = CompileIsolation(timeout_s=60.0)
        first.start(GuidedDecodingConfig(tokenizer=own))  # the fork server: backends only
        tight = CompileIsolation(timeout_s=60.0, memory_limit_bytes=64 << 20)
        config = GuidedDecodingConfig(backend="xgrammar", tokenizer=default)
        tight.probe("xgrammar", GuidedDecodingParams(choice=["yes", "no"]), config)
        first.close()
        tight.close()
        print("compiled")
    """)
    command = [sys.executable, "-c", script]
    out = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "compiled"


def test_a_worker_that_does_not_start_in_time_fails_the_probe_by_its_deadline() -> None:
    import multiprocessing as mp

    from guidedec.grammar.isolation import _Pool, _Worker

    iso = CompileIsolation(timeout_s=1.0)
    pool = _Pool(iso, GuidedDecodingConfig(tokenizer=TokenizerInfo.default()))
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    sleeper = ctx.Process(target=time.sleep, args=(60,), daemon=True)
    sleeper.start()
    start = time.monotonic()
    with pytest.raises(GrammarError, match="starting a compile worker"):
        pool._wait_ready(_Worker(sleeper, parent), "xgrammar", start + 0.5)
    assert time.monotonic() - start < 10
    assert not sleeper.is_alive()
    child.close()
