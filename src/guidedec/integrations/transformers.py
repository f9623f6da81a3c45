"""``GuidedLogitsProcessor``: guided decoding inside ``transformers``' ``model.generate``.

At each call ``generate`` passes ``input_ids`` (prompt + tokens so far, ``[batch, L]``) and the
next position's ``scores`` (``[batch, V]``). Each row's grammar matcher is brought in line with
the row's generated tokens, then the tokens its guide forbids are masked to -inf through a
:class:`~guidedec.GuidedDecoder` (one slot per row) and :func:`guidedec.bitmask.apply_bitmask`.

**Sync, not count.** Each row remembers the tokens it fed its matcher. A call compares them with
``input_ids[row, prompt_length:]``, rolls the matcher back over the fed tokens that are not a
prefix of the new sequence and feeds the new ones. So any order of calls works: plain generation
(one new token per call), assisted generation (the assistant's ``generate`` runs the same
processor; the main model calls it on prefixes of several lengths, then the sequence is cut back
to the accepted tokens), or another ``generate`` on the same prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
import transformers

from guidedec.decoder import GuidedDecoder, GuidedRequest
from guidedec.errors import REQUEST_ERRORS
from guidedec.grammar.closed_objects import closed_guide
from guidedec.grammar.config import BackendName, GuidedDecodingConfig, WhitespaceMode
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcher, GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.tokenizer import TokenizerInfo

__all__ = ["GuidedLogitsProcessor"]

Guides = GuidedDecodingParams | Sequence[GuidedDecodingParams | None]


class GuidedLogitsProcessor(transformers.LogitsProcessor):
    """Mask, at each step of ``model.generate``, the tokens each row's guide does not allow.

    Args:
        guides: One guide for every row, or one per batch row (``None``: that row is unguided;
            its scores are returned untouched). A sequence must have one entry per row of the
            batch ``generate`` runs (``batch * num_return_sequences * num_beams`` rows).
        tokenizer: A :class:`~guidedec.TokenizerInfo`, or a Hugging Face *fast* tokenizer
            (wrapped with :meth:`TokenizerInfo.from_huggingface`; its ``eos_token_id`` is the
            stop token a finished guide allows).
        backend: The grammar backend (``"auto"``, ``"xgrammar"``, ``"llguidance"``).
        vocab_size: The width of the model's logits, when known; a call whose ``scores`` have
            another width raises ``ValueError``. Default: taken from the first call's scores.
        json_whitespace: ``"flexible"`` or ``"compact"``; see
            :class:`~guidedec.GuidedDecodingConfig`.
        prompt_length: Tokens of ``input_ids`` that belong to the prompt (the same for every
            row: pad prompts on the left). Default: the width of ``input_ids`` at the first call.
        disable_additional_properties: Close each JSON-schema object that names its
            properties to others, as guidedec's engine does by default (see
            :mod:`guidedec.grammar.closed_objects`); ``False``: each guide as written.

    Vocabulary width: the bitmask always covers exactly the width ``V`` of ``scores``. A
    ``TokenizerInfo`` whose ``vocab_size`` differs from ``V`` is re-wrapped with
    ``vocab_size=V`` (same tokenizer and stop tokens); columns past the tokenizer's real
    vocabulary are padding and always masked. ``V`` smaller than the tokenizer's real vocabulary
    raises ``ValueError``.

    Finished rows: once a row's matcher has accepted a stop token, the tokens ``generate`` adds
    after it (padding) are never fed and the row's scores are left untouched.

    Errors (``ValueError``; the processor then forgets all its state, as :meth:`reset`): the
    batch size or scores width changes between calls, the prompt part of ``input_ids`` changes
    (a new ``generate`` on other prompts: call :meth:`reset` first), a guide does not compile,
    a row's new token is one its guide rejects (another processor or a forced token changed the
    choice after this one; the message names the row and the token), a row reaches a grammar
    state that allows no token (dead end), or a backend call fails. ``generate`` has no
    per-row failure, so any of these stops the whole call. A row is never left all -inf.
    """

    def __init__(
        self,
        guides: Guides,
        tokenizer: TokenizerInfo | Any,
        *,
        backend: BackendName = "auto",
        vocab_size: int | None = None,
        json_whitespace: WhitespaceMode = "flexible",
        prompt_length: int | None = None,
        disable_additional_properties: bool = True,
    ) -> None:
        self._guides = _check_guides(guides)
        if disable_additional_properties:
            self._guides = _closed(self._guides)
        if vocab_size is not None and vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        if prompt_length is not None and prompt_length < 0:
            raise ValueError(f"prompt_length must be >= 0, got {prompt_length}")
        self._tokenizer = tokenizer
        self._backend: BackendName = backend
        self._vocab_size = vocab_size
        self._json_whitespace: WhitespaceMode = json_whitespace
        self._prompt_length_arg = prompt_length
        # Kept across reset(): the tokenizer wrapping and the compiled-grammar cache.
        self._factory: GrammarMatcherFactory | None = None
        self._config: GuidedDecodingConfig | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every row's state, so that the next call starts a new ``generate``: the batch
        size, prompt length and scores width are taken again from that call."""
        self._decoder: GuidedDecoder | None = None
        self._row_guides: list[GuidedDecodingParams | None] = []
        self._fed: list[list[int]] = []
        self._prompts: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Mask ``scores`` in place for the next token of each row, and return it.

        ``input_ids`` is ``[batch, L]`` (prompt + generated tokens), ``scores`` ``[batch, V]``
        float32, float16, bfloat16 or float64. Raises ``ValueError`` as the class describes.
        """
        try:
            return cast(torch.FloatTensor, self._process(input_ids, scores))
        except ValueError:
            self.reset()
            raise
        except REQUEST_ERRORS as exc:  # a backend call failed while a row was brought in line
            self.reset()
            raise ValueError(f"guided decoding failed: {exc}") from exc

    def _process(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        _check_shapes(input_ids, scores)
        decoder = self._decoder if self._decoder is not None else self._start(input_ids, scores)
        self._check_call(input_ids, scores, decoder)
        assert self._prompts is not None
        generated: list[list[int]] = input_ids[:, self._prompts.shape[1] :].tolist()
        decoder.add_batch([self._sync_row(row, ids) for row, ids in enumerate(generated)])
        failures = decoder.build()
        if failures:
            raise ValueError("; ".join(_row_failure(row, message) for row, message in failures))
        decoder.copy_bitmask()
        decoder.apply_bitmask(scores)
        return scores

    def _start(self, input_ids: torch.Tensor, scores: torch.Tensor) -> GuidedDecoder:
        batch, width = scores.shape
        self._row_guides = self._guides_per_row(batch)
        config, factory = self._use_width(width)
        self._prompts = self._first_prompts(input_ids)
        self._fed = [[] for _ in range(batch)]
        self._decoder = GuidedDecoder(
            config=config, factory=factory, max_num_sequences=batch, device=scores.device
        )
        return self._decoder

    def _first_prompts(self, input_ids: torch.Tensor) -> torch.Tensor:
        width = input_ids.shape[1]
        length = width if self._prompt_length_arg is None else self._prompt_length_arg
        if length > width:
            raise ValueError(f"prompt_length={length} exceeds the input_ids width {width}")
        return input_ids[:, :length].clone()

    def _guides_per_row(self, batch: int) -> list[GuidedDecodingParams | None]:
        if isinstance(self._guides, GuidedDecodingParams):
            return [self._guides] * batch
        if len(self._guides) != batch:
            raise ValueError(
                f"got {len(self._guides)} guides but generate runs a batch of {batch} rows "
                "(batch * num_return_sequences * num_beams)"
            )
        return list(self._guides)

    def _use_width(self, width: int) -> tuple[GuidedDecodingConfig, GrammarMatcherFactory]:
        """The config and factory for scores ``width`` columns wide (kept while it is the same)."""
        if self._vocab_size is not None and width != self._vocab_size:
            raise ValueError(f"scores have {width} columns but vocab_size={self._vocab_size}")
        if (
            self._config is None
            or self._factory is None
            or self._config.tokenizer.vocab_size != width
        ):
            tokenizer = _tokenizer_info(self._tokenizer, width)
            self._config = GuidedDecodingConfig(
                backend=self._backend, tokenizer=tokenizer, json_whitespace=self._json_whitespace
            )
            self._factory = create_grammar_matcher_factory(self._config)
        return self._config, self._factory

    def _check_call(
        self, input_ids: torch.Tensor, scores: torch.Tensor, decoder: GuidedDecoder
    ) -> None:
        batch, width = scores.shape
        if batch != decoder.max_num_sequences:
            raise ValueError(
                f"batch size changed from {decoder.max_num_sequences} to {batch} rows; "
                "call reset() before a generate call with another batch"
            )
        if width != decoder.vocab_size:
            raise ValueError(f"scores width changed from {decoder.vocab_size} to {width} columns")
        prompts = self._prompts
        assert prompts is not None
        if input_ids.shape[1] < prompts.shape[1] or not torch.equal(
            input_ids[:, : prompts.shape[1]], prompts
        ):
            raise ValueError(
                "input_ids no longer start with the prompts of the first call "
                f"({prompts.shape[1]} tokens); call reset() before generating from new prompts"
            )

    def _sync_row(self, row: int, generated: list[int]) -> GuidedRequest:
        """Bring row ``row``'s matcher to ``generated[:-1]`` and return the request whose build
        feeds ``generated[-1]`` and fills the row (unguided when finished or without guide)."""
        params = self._row_guides[row]
        unguided = GuidedRequest(None, request_id=row, seq_slot=row)
        if params is None:
            return unguided
        fed = self._fed[row]
        if not generated:
            fed.clear()
            return GuidedRequest.context(params, request_id=row, seq_slot=row)
        matcher = self._matcher(row, params)
        common = _common_prefix(fed, generated)
        if common == len(fed) and matcher.is_terminated():
            return unguided  # finished: what follows the stop token is padding
        keep = min(common, len(generated) - 1)
        matcher.rollback(len(fed) - keep)
        del fed[keep:]
        if not self._feed(row, matcher, generated[keep:-1]):
            return unguided
        fed.append(generated[-1])
        return GuidedRequest.generation(
            params, request_id=row, seq_slot=row, new_token=generated[-1]
        )

    def _matcher(self, row: int, params: GuidedDecodingParams) -> GrammarMatcher:
        """Row ``row``'s matcher; a fresh one when it has none (its fed tokens are dropped)."""
        assert self._decoder is not None
        matcher = self._decoder.grammar_matchers[row]
        if matcher is None:
            matcher = self._decoder.new_matcher(params)
            self._decoder.grammar_matchers[row] = matcher
            self._fed[row].clear()
        return matcher

    def _feed(self, row: int, matcher: GrammarMatcher, tokens: list[int]) -> bool:
        """Feed ``tokens``; False when the matcher terminates (the rest is padding)."""
        fed = self._fed[row]
        for token in tokens:
            if not matcher.accept_token(token):
                raise ValueError(
                    f"row {row}: token {token} (after {len(fed)} generated tokens) is rejected "
                    "by the row's guide; was the choice changed after GuidedLogitsProcessor?"
                )
            fed.append(token)
            if matcher.is_terminated():
                return False
        return True


def _closed(
    guides: GuidedDecodingParams | list[GuidedDecodingParams | None],
) -> GuidedDecodingParams | list[GuidedDecodingParams | None]:
    if isinstance(guides, GuidedDecodingParams):
        return closed_guide(guides)
    return [None if g is None else closed_guide(g) for g in guides]


def _check_guides(guides: Guides) -> GuidedDecodingParams | list[GuidedDecodingParams | None]:
    if isinstance(guides, GuidedDecodingParams):
        return guides
    if isinstance(guides, str | bytes) or not isinstance(guides, Sequence):
        raise ValueError(
            "guides must be a GuidedDecodingParams or a sequence of them (None: unguided row), "
            f"got {type(guides).__name__}"
        )
    items = list(guides)
    if not items:
        raise ValueError("guides must not be empty")
    bad = [
        i for i, g in enumerate(items) if g is not None and not isinstance(g, GuidedDecodingParams)
    ]
    if bad:
        raise ValueError(f"guides[{bad[0]}] is neither a GuidedDecodingParams nor None")
    return items


def _check_shapes(input_ids: torch.Tensor, scores: torch.Tensor) -> None:
    if input_ids.dim() != 2 or scores.dim() != 2 or input_ids.shape[0] != scores.shape[0]:
        raise ValueError(
            "expected input_ids [batch, L] and scores [batch, V] with the same batch, got "
            f"{tuple(input_ids.shape)} and {tuple(scores.shape)}"
        )


def _tokenizer_info(tokenizer: TokenizerInfo | Any, width: int) -> TokenizerInfo:
    """``tokenizer`` as a TokenizerInfo whose ``vocab_size`` is ``width``."""
    if not isinstance(tokenizer, TokenizerInfo):
        return TokenizerInfo.from_huggingface(tokenizer, vocab_size=width)
    if tokenizer.vocab_size == width:
        return tokenizer
    if width < tokenizer.real_vocab_size:
        raise ValueError(
            f"scores have {width} columns, fewer than the tokenizer's "
            f"{tokenizer.real_vocab_size} tokens: wrong tokenizer for this model?"
        )
    return TokenizerInfo(
        tokenizer.hf_tokenizer, vocab_size=width, stop_token_ids=tokenizer.stop_token_ids
    )


def _row_failure(row: int, message: str) -> str:
    return f"row {row}: " + message.removeprefix(f"request {row} (slot {row}) ")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
