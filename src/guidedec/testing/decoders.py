"""One way to build a decoder for tests, examples and benchmarks."""

from __future__ import annotations

from typing import Any, TypeVar

from guidedec.decoder import GuidedDecoder
from guidedec.grammar.config import BackendName, GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.tokenizer import TokenizerInfo

D = TypeVar("D", bound=GuidedDecoder)


def make_decoder(
    tokenizer: TokenizerInfo | None = None,
    backend: BackendName = "xgrammar",
    *,
    factory: GrammarMatcherFactory | None = None,
    max_num_sequences: int = 4,
    max_num_draft_tokens: int = 0,
    decoder_class: type[D] = GuidedDecoder,  # type: ignore[assignment]
    device: Any = "cpu",
    rank: int = 0,
    **config: Any,
) -> D:
    """A ``decoder_class`` over ``GuidedDecodingConfig(backend=backend, tokenizer=tokenizer,
    **config)`` (the bundled tokenizer by default), with ``factory`` or one built from that
    config (pass a shared one so that guides compile once across decoders)."""
    tokenizer = TokenizerInfo.default() if tokenizer is None else tokenizer
    settings = GuidedDecodingConfig(backend=backend, tokenizer=tokenizer, **config)
    return decoder_class(
        config=settings,
        factory=create_grammar_matcher_factory(settings) if factory is None else factory,
        max_num_sequences=max_num_sequences,
        max_num_draft_tokens=max_num_draft_tokens,
        device=device,
        rank=rank,
    )
