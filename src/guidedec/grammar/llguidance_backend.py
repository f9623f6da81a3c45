"""The llguidance backend: Earley parsing over lazily built lexers, in Rust."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance as llg
import llguidance.hf
import torch

from guidedec.errors import GrammarError, MatcherError
from guidedec.grammar.cache import CompileCache, guide_cache_key
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.convert import (
    choice_to_lark,
    ebnf_to_lark,
    regex_for_llguidance,
    structural_tag_to_lark,
)
from guidedec.grammar.formats import without_formats
from guidedec.grammar.host import return_freed_memory
from guidedec.grammar.matcher import (
    FILLED,
    REJECTED,
    GrammarMatcher,
    GrammarMatcherFactory,
    check_rollback,
    fill_one_by_one,
)
from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.tokenizer import TokenizerInfo

BACKEND = "llguidance"
ANY_OBJECT_SCHEMA = '{"type":"object"}'
# llguidance does not report the size of a compiled grammar: a matcher template is estimated as
# a fixed overhead plus a multiple of its grammar text.
_ENTRY_OVERHEAD_BYTES = 64 * 1024
_BYTES_PER_GRAMMAR_CHAR = 16


class LLGuidanceMatcher(GrammarMatcher):
    """A :class:`GrammarMatcher` over ``llguidance.LLMatcher``, with any number of stop tokens.

    llguidance consumes a stop token itself when the grammar may end but could also go on. When
    the grammar cannot go on (the matcher has stopped), llguidance no longer consumes tokens; the
    wrapper then accepts a stop token on its own and counts it as one step for ``rollback``.
    Termination is tracked here so that the hot loop makes one native call per operation.
    """

    backend = BACKEND

    def __init__(self, matcher: llg.LLMatcher, stop_token_ids: frozenset[int], vocab_size: int):
        self._matcher = matcher
        self._stop_token_ids = stop_token_ids
        self._vocab_size = vocab_size
        self._stop_accepted_here = False
        self._terminated = False
        self._num_accepted = 0
        # The last bitmask checked, with its geometry: the hot loop fills rows of one buffer.
        self._checked_bitmask: torch.Tensor | None = None
        self._checked_base = self._num_rows = self._row_bytes = 0

    def accept_token(self, token_id: int) -> bool:
        if self._terminated or not 0 <= token_id < self._vocab_size:
            return False
        if self._matcher.try_consume_tokens([token_id]) == 1:
            self._num_accepted += 1
            if token_id in self._stop_token_ids:
                self._terminated = self._matcher.stop_reason() == "EndOfSentence"
            return True
        self._check_error()  # a rejection leaves no error; anything else is a backend failure
        if token_id in self._stop_token_ids and self._matcher.is_stopped():
            self._stop_accepted_here = self._terminated = True
            self._num_accepted += 1
            return True
        return False

    def completes(self, tokens: Sequence[int]) -> bool:
        """One ``validate_tokens`` (which moves nothing): every token accepted, the last a stop
        token (llguidance's own, since every stop token is given to it as one) that ends the
        guide, or a rejection before the last. A stop token after a grammar that has stopped
        (the wrapper accepts it itself), or one earlier in ``tokens``: token by token."""
        stops = self._stop_token_ids
        if self._terminated or len(tokens) < 2 or tokens[-1] not in stops:
            return super().completes(tokens)
        prefix = tokens[:-1]
        if min(prefix) < 0 or max(prefix) >= self._vocab_size or not stops.isdisjoint(prefix):
            return super().completes(tokens)
        valid = self._matcher.validate_tokens(list(tokens))
        if valid == len(tokens):
            return True
        if valid < len(prefix):
            return False
        return super().completes(tokens)

    unchecked_advance = True

    def advance(self, token_id: int) -> bool:
        """``consume_token``, cheaper than the ``try_consume_tokens`` of :meth:`accept_token`;
        a rejected token leaves llguidance in its error state. Stop tokens, whose acceptance
        the wrapper may count itself, take the checked path."""
        if self._terminated or token_id in self._stop_token_ids:
            return self.accept_token(token_id)
        if not 0 <= token_id < self._vocab_size or not self._matcher.consume_token(token_id):
            return False
        self._num_accepted += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._num_accepted:
            check_rollback(num_tokens, self._num_accepted)
        if num_tokens == 0:
            return
        self._num_accepted -= num_tokens
        self._terminated = False
        if self._stop_accepted_here:
            self._stop_accepted_here = False
            num_tokens -= 1
        if num_tokens > 0 and not self._matcher.rollback(num_tokens):  # False: in error
            self._check_error()

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        if self._terminated:
            raise ValueError("fill_next_token_bitmask called on a terminated matcher")
        base = bitmask.data_ptr()
        if bitmask is not self._checked_bitmask or base != self._checked_base:
            _check_host_bitmask(bitmask, self._vocab_size)
            self._checked_bitmask, self._checked_base = bitmask, base
            self._num_rows, self._row_bytes = bitmask.shape[0], bitmask.shape[1] * 4
        if not 0 <= index < self._num_rows:
            raise IndexError(f"bitmask row {index} out of range for {self._num_rows} rows")
        # What llguidance.torch.fill_next_token_bitmask does, without its per-call checks.
        matcher = self._matcher
        matcher.unsafe_compute_mask_ptr(base + index * self._row_bytes, self._row_bytes)
        if matcher.is_error():
            self._check_error()

    def advance_and_fill(self, token_id: int, bitmask: torch.Tensor, index: int) -> int:
        if (
            self._terminated
            or token_id in self._stop_token_ids
            or bitmask is not self._checked_bitmask
            or not 0 <= index < self._num_rows
        ):
            return super().advance_and_fill(token_id, bitmask, index)  # with every check
        matcher = self._matcher
        if not 0 <= token_id < self._vocab_size or not matcher.consume_token(token_id):
            return REJECTED
        self._num_accepted += 1
        base = bitmask.data_ptr()
        if base != self._checked_base:
            self.fill_next_token_bitmask(bitmask, index)  # checks the moved buffer
            return FILLED
        matcher.unsafe_compute_mask_ptr(base + index * self._row_bytes, self._row_bytes)
        if matcher.is_error():
            self._check_error()
        return FILLED

    def is_terminated(self) -> bool:
        return self._terminated

    def forced_tokens(self) -> list[int]:
        """llguidance's fast-forward tokens (canonically tokenized; it leaves out a last token
        that could merge with what follows)."""
        if self._terminated or self._matcher.is_stopped():
            return []
        tokens = [int(t) for t in self._matcher.compute_ff_tokens()]
        self._check_error()
        return tokens[: _first_stop(tokens, self._stop_token_ids)]

    def error(self) -> str | None:
        if not self._matcher.is_error():
            return None
        # The first line names the error; llguidance dumps its state and grammar after it.
        return (
            "llguidance matcher error: "
            + self._matcher.get_error().split("\n<state>", 1)[0].strip()
        )

    def _check_error(self) -> None:
        error = self.error()
        if error is not None:
            raise MatcherError(error)

    parallel_fill = True

    @classmethod
    def fill_next_token_bitmasks(
        cls,
        matchers: Sequence[GrammarMatcher],
        bitmask: torch.Tensor,
        rows: Sequence[int],
        *,
        num_threads: int,
    ) -> list[Exception | None]:
        """All rows in one ``llguidance.LLExecutor`` call, on ``num_threads`` threads; a matcher
        that errs is reported on its own (llguidance records the error in that matcher)."""
        own = [m for m in matchers if isinstance(m, LLGuidanceMatcher)]
        if len(own) != len(matchers) or any(m._terminated for m in own) or not own:
            return fill_one_by_one(matchers, bitmask, rows)
        _check_host_bitmask(bitmask, own[0]._vocab_size)
        num_rows = bitmask.shape[0]
        bad = [row for row in rows if not 0 <= row < num_rows]
        if bad:
            raise IndexError(f"bitmask rows {bad[:5]} out of range for {num_rows} rows")
        executor, lock = _executor(num_threads)
        pairs = [(m._matcher, row) for m, row in zip(own, rows, strict=True)]
        with lock:
            executor.unsafe_compute_mask_ptr(
                pairs, bitmask.data_ptr(), bitmask.shape[1] * 4, num_rows
            )
        errors: list[Exception | None] = []
        for m in own:
            try:
                m._check_error()
                errors.append(None)
            except MatcherError as exc:
                errors.append(exc)
        return errors


@functools.cache
def _executor(num_threads: int) -> tuple[llg.LLExecutor, threading.Lock]:
    """One executor (it owns a thread pool) per thread count, with a lock: the decoders of one
    process take turns on it."""
    return llg.LLExecutor(num_threads), threading.Lock()


def _check_host_bitmask(bitmask: torch.Tensor, vocab_size: int) -> None:
    if (
        bitmask.dtype != torch.int32
        or bitmask.device.type != "cpu"
        or bitmask.dim() != 2
        or not bitmask.is_contiguous()
        or bitmask.shape[1] * 32 < vocab_size
    ):
        raise ValueError(
            "the bitmask must be a contiguous 2-D int32 host tensor with ceil(V / 32) words per "
            f"row (V = {vocab_size}), got {bitmask.dtype} {tuple(bitmask.shape)} on "
            f"{bitmask.device}"
        )


def llguidance_tokenizer(tokenizer: TokenizerInfo) -> llg.LLTokenizer:
    """llguidance's view of ``tokenizer`` (built once per TokenizerInfo)."""
    return tokenizer.backend_object(
        BACKEND,
        lambda: llguidance.hf.from_tokenizer(
            tokenizer.hf_tokenizer,
            n_vocab=tokenizer.vocab_size,
            eos_token=list(tokenizer.stop_token_ids),
        ),
    )


class LLGuidanceMatcherFactory(GrammarMatcherFactory):
    """Compiles guides to llguidance grammars; caches one matcher per guide and copies it."""

    backend = BACKEND

    def __init__(self, config: GuidedDecodingConfig) -> None:
        self.config = config
        self._tokenizer = llguidance_tokenizer(config.tokenizer)
        self._stop_token_ids = frozenset(config.tokenizer.stop_token_ids)
        self.cache: CompileCache[_Template] = CompileCache(config.cache_limit_bytes)
        self._json_options = _json_options(config)

    def create(self, params: GuidedDecodingParams) -> LLGuidanceMatcher:
        template = self.compile(params)
        return LLGuidanceMatcher(
            template.matcher.deep_copy(), self._stop_token_ids, self.config.tokenizer.vocab_size
        )

    def forget(self, params: GuidedDecodingParams) -> None:
        if self.cache.discard(guide_cache_key(params)):
            return_freed_memory()

    def compile(self, params: GuidedDecodingParams) -> _Template:
        """A matcher at the start of ``params``' grammar, kept in the cache as a template."""
        return self.cache.get_or_compile(
            guide_cache_key(params), lambda: self._compile(params), _Template.estimated_size
        )

    def grammar_text(self, params: GuidedDecodingParams) -> str:
        """The llguidance grammar (JSON text) for ``params``.

        Raises:
            GrammarError: the guide is not valid JSON or cannot be converted.
        """
        try:
            return self._grammar_text(params)
        except GrammarError:
            raise
        except (ValueError, TypeError) as exc:
            message = f"cannot convert {params.guide_type.value} guide: {exc}"
            raise GrammarError(message, backend=BACKEND) from exc

    def _grammar_text(self, params: GuidedDecodingParams) -> str:
        guide_type, guide = params.guide_type, params.guide
        if guide_type is GuideType.JSON_OBJECT:
            return self._json_grammar(ANY_OBJECT_SCHEMA)
        if guide_type is GuideType.JSON_SCHEMA:
            assert isinstance(guide, str)
            return self._json_grammar(guide)
        if guide_type is GuideType.CHOICE:
            assert isinstance(guide, tuple)
            return llg.LLMatcher.grammar_from_lark(choice_to_lark(guide))
        assert isinstance(guide, str)
        if guide_type is GuideType.REGEX:
            return llg.LLMatcher.grammar_from_regex(regex_for_llguidance(guide))
        if guide_type is GuideType.EBNF:
            return llg.LLMatcher.grammar_from_lark(ebnf_to_lark(guide))
        if guide_type is GuideType.LARK:
            return llg.LLMatcher.grammar_from_lark(guide)
        return llg.LLMatcher.grammar_from_lark(structural_tag_to_lark(guide))

    def _json_grammar(self, schema: str) -> str:
        try:
            json.loads(schema)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise GrammarError(f"json_schema is not valid JSON: {exc}", backend=BACKEND) from exc
        schema = without_formats(schema, knows_format)
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=self._json_options)

    def _compile(self, params: GuidedDecodingParams) -> _Template:
        self.config.limits.check(params)
        held = None
        if self.isolation is not None:
            held = self.isolation.probe(BACKEND, params, self.config).heap_bytes
        grammar = self.grammar_text(params)
        matcher = llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            message = f"cannot compile {params.guide_type.value} guide: {matcher.get_error()}"
            raise GrammarError(message, backend=BACKEND)
        return _Template(matcher, len(grammar), held or 0)


@dataclass(frozen=True, slots=True)
class _Template:
    """A compiled matcher at its start state; every request gets a deep copy."""

    matcher: llg.LLMatcher
    grammar_chars: int
    measured_bytes: int = 0  # the heap its compile and first mask took in a probe worker

    def estimated_size(self) -> int:
        """What the cache counts: the heap measured in the probe worker, where there was one
        (llguidance reports no size: a Lark regex nested ``{100}`` deep holds 38 MB from a
        60-character grammar), else an estimate from the grammar's length."""
        estimate = _ENTRY_OVERHEAD_BYTES + _BYTES_PER_GRAMMAR_CHAR * self.grammar_chars
        return max(estimate, self.measured_bytes)


@functools.lru_cache(maxsize=1024)
def knows_format(name: str) -> bool:
    """Whether llguidance enforces the string format ``name`` (it refuses a schema with any
    other: see :mod:`guidedec.grammar.formats`)."""
    schema = json.dumps({"type": "string", "format": name})
    return not llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_json_schema(schema))


def _json_options(config: GuidedDecodingConfig) -> Any:
    # llguidance's JSON strings take ``\u`` escapes only for control characters unless told
    # otherwise; ``json.dumps("é")`` writes ``"\u00e9"``, and xgrammar accepts it.
    options: dict[str, Any] = {"json_allow_general_unicode_escapes": True}
    limit = config.json_whitespace_limit
    if limit == 0:
        return options | {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    return options | {
        "whitespace_flexible": True,
        "whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{limit}}}",
    }


def _first_stop(tokens: list[int], stop_token_ids: frozenset[int]) -> int:
    """The index of the first stop token in ``tokens`` (their length when none)."""
    return next((i for i, t in enumerate(tokens) if t in stop_token_ids), len(tokens))
