"""Shared fixtures: the default tokenizer and one matcher factory per backend (built once)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from guidedec import (
    GrammarMatcherFactory,
    GuidedDecodingConfig,
    TokenizerInfo,
    create_grammar_matcher_factory,
)

BACKENDS = ("xgrammar", "llguidance", "auto")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


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
            _factories[key] = create_grammar_matcher_factory(config)
        return _factories[key]

    return make


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def factory(
    backend: str, make_factory: Callable[..., GrammarMatcherFactory]
) -> GrammarMatcherFactory:
    return make_factory(backend)


def data_path(*parts: str) -> Path:
    """A file of the shared public test data; the test is skipped where it is absent."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"test data not found: {path}")
    return path
