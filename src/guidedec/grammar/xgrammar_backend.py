"""The xgrammar backend: compiled grammars with xgrammar's persistent-stack Earley matcher."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import torch
import xgrammar as xgr

from guidedec.errors import GrammarError
from guidedec.grammar.cache import CompileCache, guide_cache_key
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.convert import (
    choice_to_ebnf,
    normalize_ebnf,
    regex_for_xgrammar,
    structural_tag_to_xgrammar_arg,
)
from guidedec.grammar.disk_cache import DiskCompileCache
from guidedec.grammar.host import return_freed_memory
from guidedec.grammar.matcher import (
    FILLED,
    REJECTED,
    TERMINATED,
    GrammarMatcher,
    GrammarMatcherFactory,
    check_rollback,
    fill_one_by_one,
)
from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.grammar.schema_rewrite import rewrite_for_xgrammar
from guidedec.grammar.xgrammar_tokenizer import (
    TokenBytes,
    xgrammar_token_bytes,
    xgrammar_tokenizer_info,
)
from guidedec.version import __version__

BACKEND = "xgrammar"
ANY_OBJECT_SCHEMA = '{"type":"object"}'
_XGRAMMAR_LOCATION = re.compile(r"^(\[[^\]]*\] )?\S+\.(cc|h):\d+: ")


STRING_FROM = 6
"""The fewest tokens :meth:`XGrammarMatcher.completes` checks as one string (measured: one
``accept_token`` costs about 1 µs, ``accept_string`` and its rollback about 4 µs more)."""


class XGrammarMatcher(GrammarMatcher):
    """A :class:`GrammarMatcher` over ``xgrammar.GrammarMatcher``.

    Termination is tracked here (it starts when a stop token is accepted and ends with any
    rollback) so that the hot loop makes one native call per operation.
    """

    backend = BACKEND

    def __init__(
        self,
        matcher: xgr.GrammarMatcher,
        stop_token_ids: frozenset[int],
        encode: Callable[[str], list[int]] | None = None,
        token_bytes: Callable[[], TokenBytes] | None = None,
    ) -> None:
        self._matcher = matcher
        # The native methods under xgrammar's Python ones (each of which is one call to its
        # handle): the hot loop saves a Python frame per token and per row.
        self._native = _native_calls(matcher)
        self._stop_token_ids = stop_token_ids
        self._encode = encode  # the tokenizer, for forced_tokens
        self._token_bytes = token_bytes  # each token's text, for completes
        self._num_accepted = 0
        self._terminated = False
        self._checked_bitmask: torch.Tensor | None = None  # the last bitmask found well-formed

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False  # xgrammar would log a warning for every such call
        if not self._native.accept_token(token_id, False):
            return False
        self._num_accepted += 1
        # Only a stop token terminates an xgrammar matcher.
        self._terminated = token_id in self._stop_token_ids and self._matcher.is_terminated()
        return True

    # A rejected token leaves an xgrammar matcher as it was: the checked accept is the plain
    # one, bound directly (no call through the base class's advance).
    advance = accept_token

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._num_accepted:
            check_rollback(num_tokens, self._num_accepted)
        if num_tokens > 0:
            self._native.rollback(num_tokens)
            self._num_accepted -= num_tokens
            self._terminated = False

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        if self._terminated:
            raise ValueError("fill_next_token_bitmask called on a terminated matcher")
        if bitmask is not self._checked_bitmask:
            # xgrammar writes a non-contiguous (strided) bitmask as if it were contiguous.
            if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or not bitmask.is_contiguous():
                raise ValueError(
                    "the bitmask must be a contiguous 2-D int32 tensor, got "
                    f"{bitmask.dtype} {tuple(bitmask.shape)} (contiguous: "
                    f"{bitmask.is_contiguous()})"
                )
            self._checked_bitmask = bitmask
        self._native.fill_next_token_bitmask(bitmask, index, False)

    def advance_and_fill(self, token_id: int, bitmask: torch.Tensor, index: int) -> int:
        if self._terminated or bitmask is not self._checked_bitmask:
            return super().advance_and_fill(token_id, bitmask, index)  # with every check
        native = self._native
        if not native.accept_token(token_id, False):
            return REJECTED
        self._num_accepted += 1
        if token_id in self._stop_token_ids and self._matcher.is_terminated():
            self._terminated = True
            return TERMINATED
        native.fill_next_token_bitmask(bitmask, index, False)
        return FILLED

    def is_terminated(self) -> bool:
        return self._terminated

    def completes(self, tokens: Sequence[int]) -> bool:
        """The text of all tokens but the last (a stop token) in one ``accept_string``, one
        step for rollback, where every one of them is accepted as its text alone (not a stop
        token, not a token without text); else, and for fewer than ``STRING_FROM`` tokens
        (the loop is cheaper there), token by token."""
        if self._terminated or self._token_bytes is None or len(tokens) < STRING_FROM:
            return super().completes(tokens)
        texts, opaque = self._token_bytes()
        prefix = tokens[:-1]
        if min(prefix) < 0 or max(prefix) >= len(texts) or not opaque.isdisjoint(prefix):
            return super().completes(tokens)
        before = self._num_accepted
        if not self._matcher.accept_string(b"".join([texts[t] for t in prefix])):
            return False  # a rejected string leaves the matcher as it was
        self._num_accepted += 1
        complete = self.accept_token(tokens[-1]) and self._terminated
        self.rollback(self._num_accepted - before)
        return complete

    def forced_tokens(self) -> list[int]:
        """xgrammar's jump-forward string, encoded; the tokens up to the first the matcher
        rejects (a split the grammar does not take), without the last (it may merge with what
        follows)."""
        if self._terminated or self._encode is None:
            return []
        text = self._matcher.find_jump_forward_string()
        if not text:
            return []
        tokens = self._encode(text)[:-1]
        accepted = 0
        for token in tokens:
            if not self.accept_token(token) or self._terminated:
                break
            accepted += 1
        self.rollback(accepted + self._terminated)
        return tokens[:accepted]

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
        """All rows in one ``xgrammar.BatchGrammarMatcher`` call, on ``num_threads`` threads.

        xgrammar raises for the whole batch when one row cannot be filled; the rows are then
        filled one by one, so that the failure is reported for its own request only.
        """
        inner = [m._matcher for m in matchers if isinstance(m, XGrammarMatcher)]
        if len(inner) != len(matchers) or any(m.is_terminated() for m in matchers):
            return fill_one_by_one(matchers, bitmask, rows)
        batch_matcher, lock = _batch_matcher(num_threads)
        try:
            with lock:
                batch_matcher.batch_fill_next_token_bitmask(inner, bitmask, list(rows))
        except (RuntimeError, ValueError, TypeError):
            return fill_one_by_one(matchers, bitmask, rows)
        return [None] * len(matchers)


class _PublicCalls:
    """The native calls' shapes over xgrammar's public methods, for a matcher without the
    handle that its Python methods call through."""

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher

    def accept_token(self, token_id: int, debug_print: bool) -> bool:
        return self._matcher.accept_token(token_id, debug_print=debug_print)

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int, debug_print: bool) -> bool:
        return self._matcher.fill_next_token_bitmask(bitmask, index, debug_print=debug_print)


_NATIVE_METHODS = ("accept_token", "rollback", "fill_next_token_bitmask")


def _native_calls(matcher: xgr.GrammarMatcher) -> Any:
    """``matcher``'s native handle where its Python methods are plain calls of it (xgrammar
    0.2.x), else :class:`_PublicCalls`: the same calls through the public methods."""
    handle = getattr(matcher, "_handle", None)
    if type(matcher) is xgr.GrammarMatcher and all(
        callable(getattr(handle, name, None)) for name in _NATIVE_METHODS
    ):
        return handle
    return _PublicCalls(matcher)


@functools.cache
def _batch_matcher(num_threads: int) -> tuple[xgr.BatchGrammarMatcher, threading.Lock]:
    """One batch matcher (it owns a thread pool) per thread count, with a lock: the decoders of
    one process take turns on it."""
    return xgr.BatchGrammarMatcher(num_threads), threading.Lock()


class XGrammarMatcherFactory(GrammarMatcherFactory):
    """Compiles guides with ``xgrammar.GrammarCompiler`` into a guidedec :class:`CompileCache`."""

    backend = BACKEND

    def __init__(self, config: GuidedDecodingConfig) -> None:
        self.config = config
        self._compiler = xgr.GrammarCompiler(
            xgrammar_tokenizer_info(config.tokenizer),
            max_threads=min(8, os.cpu_count() or 1),
            cache_enabled=False,
        )
        self.cache: CompileCache[xgr.CompiledGrammar] = CompileCache(config.cache_limit_bytes)
        self._stop_token_ids = frozenset(config.tokenizer.stop_token_ids)
        self.disk: DiskCompileCache | None = None
        if config.compile_cache_dir is not None:
            self.disk = DiskCompileCache(Path(config.compile_cache_dir), self._disk_context())

    def _disk_context(self) -> str:
        """What a compiled grammar depends on besides its guide (see the disk cache's key)."""
        tokenizer = self.config.tokenizer
        info = xgrammar_tokenizer_info(tokenizer)
        fingerprint = tokenizer.backend_object(
            "xgrammar-fingerprint",
            lambda: hashlib.sha256(info.serialize_json().encode()).hexdigest(),
        )
        versions = f"guidedec {__version__}, xgrammar {importlib.metadata.version('xgrammar')}"
        whitespace = self.config.json_whitespace_limit
        return f"{versions}; tokenizer {fingerprint}; whitespace {whitespace}"

    def create(self, params: GuidedDecodingParams) -> XGrammarMatcher:
        compiled = self.compile(params)
        tokenizer = self.config.tokenizer
        return XGrammarMatcher(
            xgr.GrammarMatcher(compiled),
            self._stop_token_ids,
            tokenizer.encode,
            functools.partial(xgrammar_token_bytes, tokenizer),
        )

    def warm_up(self) -> None:
        xgrammar_token_bytes(self.config.tokenizer)  # what a matcher's completes reads

    def forget(self, params: GuidedDecodingParams) -> None:
        if self.cache.discard(guide_cache_key(params)):
            return_freed_memory()

    def compile(self, params: GuidedDecodingParams) -> xgr.CompiledGrammar:
        """The compiled grammar of ``params`` (cached in memory, and on disk where configured)."""
        key = guide_cache_key(params)
        return self.cache.get_or_compile(
            key, lambda: self._compile(params, key), lambda g: int(g.memory_size_bytes)
        )

    def _compile(self, params: GuidedDecodingParams, key: Hashable) -> xgr.CompiledGrammar:
        self.config.limits.check(params)
        disk = self.disk
        if disk is not None:
            loaded = disk.load(key, self._deserialize)
            if loaded is not None:
                return loaded  # compiled (and probed) when it was stored
        if self.isolation is not None:
            self.isolation.probe(BACKEND, params, self.config)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled = self._compile_unchecked(params)
        except GrammarError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError, ValueError and its own types
            raise GrammarError(_describe(params, exc), backend=BACKEND) from exc
        elapsed = time.perf_counter() - start
        if disk is not None and disk.worth_storing(elapsed, int(compiled.memory_size_bytes)):
            disk.store_later(key, compiled.serialize_json)
        return compiled

    def _deserialize(self, text: str) -> xgr.CompiledGrammar:
        info = xgrammar_tokenizer_info(self.config.tokenizer)
        return xgr.CompiledGrammar.deserialize_json(text, info)

    def _compile_unchecked(self, params: GuidedDecodingParams) -> xgr.CompiledGrammar:
        guide_type, guide = params.guide_type, params.guide
        if guide_type is GuideType.JSON_OBJECT:
            return self._compile_json(ANY_OBJECT_SCHEMA)
        if guide_type is GuideType.JSON_SCHEMA:
            assert isinstance(guide, str)
            schema = rewrite_for_xgrammar(_checked_json(guide, "json_schema"))
            return self._compile_json(schema)
        if guide_type is GuideType.CHOICE:
            assert isinstance(guide, tuple)
            return self._compiler.compile_grammar(choice_to_ebnf(guide))
        assert isinstance(guide, str)
        if guide_type is GuideType.REGEX:
            return self._compiler.compile_regex(regex_for_xgrammar(guide))
        if guide_type is GuideType.EBNF:  # GBNF-only forms too, as on llguidance
            return self._compiler.compile_grammar(normalize_ebnf(guide))
        if guide_type is GuideType.LARK:
            return self._compiler.compile_lark(guide)
        tag = structural_tag_to_xgrammar_arg(_checked_json(guide, "structural_tag"))
        return self._compiler.compile_structural_tag(json.dumps(_rewrite_schemas(json.loads(tag))))

    def _compile_json(self, schema: str) -> xgr.CompiledGrammar:
        limit = self.config.json_whitespace_limit
        if limit == 0:
            return self._compiler.compile_json_schema(
                schema, any_whitespace=False, separators=(",", ":"), strict_mode=False
            )
        return self._compiler.compile_json_schema(
            schema, any_whitespace=True, max_whitespace_cnt=limit, strict_mode=False
        )


def _checked_json(text: str, what: str) -> str:
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise GrammarError(f"{what} is not valid JSON: {exc}", backend=BACKEND) from exc
    return text


def _describe(params: GuidedDecodingParams, exc: Exception) -> str:
    message = str(exc).strip() or type(exc).__name__
    # xgrammar prefixes its C++ errors with a timestamp and a source location.
    message = _XGRAMMAR_LOCATION.sub("", message)
    return f"cannot compile {params.guide_type.value} guide: {message}"


def _rewrite_schemas(node: Any) -> Any:
    """A structural tag with each JSON schema in it restated as for a JSON-schema guide
    (:func:`~guidedec.grammar.schema_rewrite.rewrite_for_xgrammar`)."""
    if isinstance(node, list):
        return [_rewrite_schemas(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _rewrite_schemas(value) for key, value in node.items()}
    if node.get("type") == "json_schema" and isinstance(node.get("json_schema"), dict):
        text = rewrite_for_xgrammar(json.dumps(node["json_schema"]), list_required=True)
        out["json_schema"] = json.loads(text)
    return out
