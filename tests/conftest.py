"""Shared fixtures: the default tokenizer and one matcher factory per backend (built once)."""

from __future__ import annotations

import functools
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import guidedec.decoder.closing.settings
import summary
from guidedec import (
    LLM,
    GrammarMatcherFactory,
    GuidedDecodingConfig,
    TokenizerInfo,
    create_grammar_matcher_factory,
)
from guidedec.engine.model import TINY_RANDOM, LoadedModel, load_model
from guidedec.grammar.auto import AutoMatcherFactory

BACKENDS = ("xgrammar", "llguidance", "auto")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REQUIRE_DATA_ENV = "GUIDEDEC_REQUIRE_DATA"
"""Set to 1 (CI sets it) and a ``data`` test whose shared data is missing fails instead of
skipping: a clone without the data must not pass for one with it."""


def missing_data(what: Path) -> None:
    """End the current test for want of the shared data ``what``: a failure under
    ``GUIDEDEC_REQUIRE_DATA=1``, else a skip."""
    message = f"shared test data not found: {what}"
    if os.environ.get(REQUIRE_DATA_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_DATA_ENV}=1)", pytrace=False)
    pytest.skip(message)


def pytest_configure(config: pytest.Config) -> None:
    # Each pytest-xdist worker is a process of its own: split the cores between them. With two
    # workers of two torch threads each on two cores, a random-logits step ran ~2.4x slower.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def steady_search(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budget-closing searches never give up on time (``SLOW_SEARCH_S``) unless a test is
    marked ``timed_search``: on a loaded machine (a parallel run) a search could give up in one
    run and not in the other, and tests compare runs token for token."""
    if request.node.get_closest_marker("timed_search") is None:
        monkeypatch.setattr(guidedec.decoder.closing.settings, "SLOW_SEARCH_S", math.inf)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``data`` test, ``@pytest.mark.data`` or ``@pytest.mark.data("path/under/data")``, runs
    only where its data is (see :func:`missing_data`)."""
    for marker in item.iter_markers("data"):
        for path in [DATA.joinpath(*part.split("/")) for part in marker.args] or [DATA]:
            if not path.exists():
                missing_data(path)


def data_params(values: list[Any], *parts: str) -> list[Any]:
    """``values`` read at collection from the shared data file ``parts``, for parametrize;
    where that file is absent, one ``data`` case that fails or skips as :func:`missing_data`
    says (an empty list would make pytest skip the test without a word)."""
    if values or DATA.joinpath(*parts).exists():
        return values
    return [pytest.param(None, marks=pytest.mark.data("/".join(parts)), id="missing-data")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tokenizer() -> TokenizerInfo:
    return TokenizerInfo.default()


_factories: dict[tuple[str, str], GrammarMatcherFactory] = {}


class SharedAutoFactory(AutoMatcherFactory):
    """``auto`` over the session's backend factories, so that it reuses their compiled grammars
    (an xgrammar JSON-schema compile takes ~0.1-1 s with the default 129k-token vocabulary)."""

    def __init__(
        self, config: GuidedDecodingConfig, backend: Callable[[str], GrammarMatcherFactory]
    ) -> None:
        super().__init__(config)
        self._backend = backend

    def factory(self, name: str) -> GrammarMatcherFactory:
        return self._backend(name)


@pytest.fixture(scope="session")
def make_factory(tokenizer: TokenizerInfo) -> Callable[..., GrammarMatcherFactory]:
    """A factory per (backend, whitespace mode), shared by the whole session."""

    def make(backend: str, json_whitespace: str = "flexible") -> GrammarMatcherFactory:
        key = (backend, json_whitespace)
        if key not in _factories:
            config = GuidedDecodingConfig(
                backend=backend,  # type: ignore[arg-type]
                tokenizer=tokenizer,
                json_whitespace=json_whitespace,  # type: ignore[arg-type]
            )
            if backend == "auto":
                shared = functools.partial(make, json_whitespace=json_whitespace)
                _factories[key] = SharedAutoFactory(config, shared)
            else:
                _factories[key] = create_grammar_matcher_factory(config)
        return _factories[key]

    return make


@pytest.fixture(scope="module", params=["float32", "float64"])
def model(request: pytest.FixtureRequest) -> LoadedModel:
    """tiny-random in float32 and in float64 (the runners' equivalence tests)."""
    return load_model(TINY_RANDOM, dtype=request.param)


@pytest.fixture(scope="module")
def model64() -> LoadedModel:
    """tiny-random in float64."""
    return load_model(TINY_RANDOM, dtype="float64")


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def engine64(request: pytest.FixtureRequest) -> Iterator[LLM]:
    """An engine on tiny-random in float64, on each backend, compiling in its own process."""
    engine = LLM(
        TINY_RANDOM,
        backend=request.param,
        max_num_seqs=4,
        dtype=torch.float64,
        isolate_compiles=False,
    )
    yield engine
    engine.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def factory(
    backend: str, make_factory: Callable[..., GrammarMatcherFactory]
) -> GrammarMatcherFactory:
    return make_factory(backend)


def data_path(*parts: str) -> Path:
    """A file of the shared public test data (see :func:`missing_data` where it is absent)."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        missing_data(path)
    return path


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    summary.write_table(terminalreporter)
