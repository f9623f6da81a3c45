"""A bounded memo: the caches of derived values (a guide's words, a text's encoding) that the
hot paths keep, each held to a number of entries."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Kept(Generic[K, V]):
    """A map of at most ``size`` entries that forgets them all when a new key would exceed it:
    its values are cheap to derive again, and the keys in use come back at once."""

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._entries: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key``; returns it."""
        if key not in self._entries and len(self._entries) >= self.size:
            self._entries.clear()
        self._entries[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
