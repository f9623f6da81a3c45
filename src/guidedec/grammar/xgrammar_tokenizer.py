"""xgrammar's view of a tokenizer, built once per :class:`TokenizerInfo` and kept on it."""

from __future__ import annotations

import xgrammar as xgr

from guidedec.tokenizer import TokenizerInfo

TokenBytes = tuple[list[bytes], frozenset[int]]
"""Each token's text as xgrammar matches it, and the tokens not accepted as their text alone
(stop tokens, tokens without text)."""


def xgrammar_token_bytes(tokenizer: TokenizerInfo) -> TokenBytes:
    """:data:`TokenBytes` of ``tokenizer`` (built once: about a second)."""

    def build() -> TokenBytes:
        info = xgrammar_tokenizer_info(tokenizer)
        texts = list(info.decoded_vocab)
        opaque = {t for t, text in enumerate(texts) if not text}
        opaque |= set(tokenizer.stop_token_ids) | set(info.special_token_ids)
        return texts, frozenset(opaque)

    return tokenizer.backend_object("xgrammar-token-bytes", build)


def xgrammar_tokenizer_info(tokenizer: TokenizerInfo) -> xgr.TokenizerInfo:
    """xgrammar's view of ``tokenizer`` (built once per TokenizerInfo).

    The stop tokens are given no text, so that they never match text inside a grammar: xgrammar
    would otherwise accept ``<｜end▁of▁sentence｜>`` wherever its characters fit, e.g. to
    complete ``.+`` with nothing before it. Other special tokens keep their text: xgrammar never
    accepts a token without text, and token-level grammars and structural tags (``<[id]>``,
    ``token`` formats) must still be able to name them.
    """
    return tokenizer.backend_object("xgrammar", lambda: _build_tokenizer_info(tokenizer))


def _build_tokenizer_info(tokenizer: TokenizerInfo) -> xgr.TokenizerInfo:
    hf = tokenizer.hf_tokenizer
    detected = xgr.TokenizerInfo.from_huggingface(
        hf, vocab_size=tokenizer.vocab_size, stop_token_ids=list(tokenizer.stop_token_ids)
    )
    encoded_vocab = [""] * tokenizer.vocab_size
    for text, token_id in hf.get_vocab().items():
        if token_id < tokenizer.vocab_size:
            encoded_vocab[token_id] = text
    for token_id in tokenizer.stop_token_ids:
        encoded_vocab[token_id] = ""
    return xgr.TokenizerInfo(
        encoded_vocab,
        detected.vocab_type,
        vocab_size=tokenizer.vocab_size,
        stop_token_ids=list(tokenizer.stop_token_ids),
        add_prefix_space=detected.add_prefix_space,
    )
