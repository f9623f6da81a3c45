"""A thread-safe compile cache keyed by the canonical guide, bounded by bytes."""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from guidedec.grammar.params import GuidedDecodingParams, GuideType

V = TypeVar("V")

# Keywords whose value is data (not a schema): their key order is part of the output text.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})
# Keywords mapping names to sub-schemas, in an order that the generated output follows.
_ORDERED_MAPS = frozenset({"properties"})


KEPT_CANONICAL_CHARS = 1 << 16
"""Schemas up to this long have their canonical text kept (:func:`canonical_json_schema`)."""


def canonical_json_schema(schema: str) -> str:
    """A canonical text of a JSON schema: the same for schemas that mean the same output.

    Whitespace is dropped and object keys are sorted, except where order is meaningful: the
    names under ``properties`` (backends emit properties in declared order) and data values
    (``const``, ``enum``, ``default``, ``examples``). Text that is not JSON is returned as is.
    The texts of the last 256 schemas of at most ``KEPT_CANONICAL_CHARS`` are kept: a request's
    guide is keyed several times on its way to a matcher (``auto``'s choice, the backend's
    cache), about a millisecond each for a large schema.
    """
    if len(schema) <= KEPT_CANONICAL_CHARS:
        return _kept_canonical(schema)
    return _canonical_text(schema)


@functools.lru_cache(maxsize=256)
def _kept_canonical(schema: str) -> str:
    return _canonical_text(schema)


def _canonical_text(schema: str) -> str:
    try:
        value = json.loads(schema)
    except (json.JSONDecodeError, RecursionError):
        return schema
    return json.dumps(_canonical(value), separators=(",", ":"), ensure_ascii=False)


def guide_cache_key(params: GuidedDecodingParams) -> Hashable:
    """The cache key of a guide: its type and canonical text. It is computed once per params
    object (kept on it): a request's guide is keyed several times on its way to a matcher, and
    a schema over ``KEPT_CANONICAL_CHARS`` costs its whole canonical text each time."""
    key = params._cache_key
    if key is None:
        if params.guide_type is GuideType.JSON_SCHEMA:
            assert isinstance(params.guide, str)
            key = (params.guide_type.value, canonical_json_schema(params.guide))
        else:
            key = (params.guide_type.value, params.guide)
        object.__setattr__(params, "_cache_key", key)
    return key


def _canonical(node: Any, *, keep_order: bool = False) -> Any:
    if isinstance(node, list):
        return [_canonical(item) for item in node]
    if not isinstance(node, dict):
        return node
    keys = list(node) if keep_order else sorted(node)
    out: dict[str, Any] = {}
    for key in keys:
        value = node[key]
        if keep_order:
            out[key] = _canonical(value)
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _canonical(value, keep_order=key in _ORDERED_MAPS)
    return out


@dataclass(frozen=True)
class CacheStats:
    """Counters of a :class:`CompileCache`."""

    hits: int
    misses: int
    entries: int
    size_bytes: int
    limit_bytes: int


class CompileCache(Generic[V]):
    """Least-recently-used cache of compiled grammars with a byte budget.

    An entry larger than the whole budget is returned but not kept. Compilation runs outside the
    lock, so two threads may compile the same key at once; the first result stored wins.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def get_or_compile(
        self, key: Hashable, compile_fn: Callable[[], V], size_fn: Callable[[V], int]
    ) -> V:
        """The cached value for ``key``, compiling and storing it on a miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return entry[0]
            self._misses += 1
        value = compile_fn()
        self._store(key, value, max(0, size_fn(value)))
        return value

    def _store(self, key: Hashable, value: V, size: int) -> None:
        if size > self.limit_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (value, size)
            self._size += size
            while self._size > self.limit_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._size -= evicted

    def discard(self, key: Hashable) -> int:
        """Drop ``key``'s entry, if any; the bytes it was counted for (0 when absent)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return 0
            self._size -= entry[1]
            return entry[1]

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._entries.clear()
            self._size = 0

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return CacheStats(
                self._hits, self._misses, len(self._entries), self._size, self.limit_bytes
            )
