"""A compile cache on disk: xgrammar's compiled grammars, kept across restarts and processes.

xgrammar serializes a compiled grammar to JSON (``CompiledGrammar.serialize_json``) and reads
it back against the same tokenizer. :class:`DiskCompileCache` keeps one file per guide in a
directory that several server processes may share:

- **Key.** The SHA-256 of everything the compiled grammar depends on: the guide's canonical
  text (:func:`guidedec.grammar.cache.guide_cache_key`), the compile options (JSON whitespace),
  the versions of guidedec (its schema rewrites) and of xgrammar, and a fingerprint of the
  tokenizer (the hash of xgrammar's serialized tokenizer info). The key names the file.
- **Writes are atomic**: a temporary file in the same directory, then ``os.replace``; readers
  see a whole entry or none, and the last writer of a key wins (both wrote the same grammar).
- **Nothing read is trusted**: an entry starts with a header line that repeats its key, its
  format and its payload's length; a file whose header does not match (another version,
  another tokenizer, a truncated write, a stranger's file) or that xgrammar refuses to read is
  ignored, the guide is compiled, and the entry written again.
- **Writes happen on a thread of their own** (:meth:`DiskCompileCache.store_later`): writing a
  large grammar takes seconds, and the request that compiled it does not wait for them.
- **What is kept**: only compiles that took at least ``min_compile_s`` (a fast compile is
  cheaper than a read) and whose entry would hold at most ``max_entry_bytes`` (estimated from
  the grammar's memory before it is serialized); the directory is
  held to ``limit_bytes``, the least recently used entries (by modification time, refreshed on
  each read) removed first.

llguidance is not cached on disk: it compiles a guide in about a millisecond and builds its
lexer lazily while masks are computed, which no file keeps. The directory should be writable by
the server's user only: xgrammar reads what it finds there (after the checks above).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

logger = logging.getLogger(__name__)

FORMAT = 1
SUFFIX = ".xgrammar.json"
TEMP_PREFIX = ".tmp-"
SERIALIZED_PER_BYTE = 12
"""xgrammar's JSON of a compiled grammar over its ``memory_size_bytes`` (measured: 185 MB of JSON
for a 16 MB Kubernetes grammar): the serialization is estimated before it is made."""
T = TypeVar("T")
MAX_PENDING = 4
"""Writes waiting for the writer thread, at most (each holds a compiled grammar)."""


@dataclass(slots=True)
class DiskCacheStats:
    """What the disk cache did, summed over its life."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    ignored: int = 0  # entries that failed their checks
    evicted: int = 0


@dataclass
class DiskCompileCache:
    """Serialized compiled grammars in ``directory`` (created if missing); see the module
    docstring. ``context``: what, besides the guide, the compiled grammar depends on."""

    directory: Path
    context: str
    min_compile_s: float = 0.05
    max_entry_bytes: int = 256 << 20
    limit_bytes: int = 4 << 30
    stats: DiskCacheStats = field(default_factory=DiskCacheStats)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._writer: ThreadPoolExecutor | None = None
        self._pending = 0

    def key(self, guide_key: Hashable) -> str:
        """The entry's key for a guide (hex SHA-256)."""
        material = json.dumps([FORMAT, self.context, repr(guide_key)], ensure_ascii=False)
        return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()

    def load(self, guide_key: Hashable, read: Callable[[str], T]) -> T | None:
        """The guide's entry, read back with ``read`` (the backend's deserializer), or None when
        there is none that passes the checks and reads back (such a file is removed and counted
        in ``stats.ignored``)."""
        path = self._path(guide_key)
        try:
            with open(path, "rb") as f:
                header = json.loads(f.readline())
                data = f.read()
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except (OSError, ValueError) as exc:
            self._ignore(path, f"unreadable: {exc}")
            return None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            self._ignore(path, "another format")
            return None
        if header.get("key") != path.name.removesuffix(SUFFIX) or header.get("bytes") != len(data):
            self._ignore(path, "its header does not match")
            return None
        try:
            value = read(data.decode("utf-8"))
        except Exception as exc:  # not UTF-8, or the backend refuses it
            self._ignore(path, f"unreadable by the backend: {exc}")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used
        self.stats.hits += 1
        return value

    def worth_storing(self, compile_s: float, size_bytes: int) -> bool:
        """Whether a grammar that took ``compile_s`` and holds ``size_bytes`` in memory is kept
        (its entry, about ``SERIALIZED_PER_BYTE`` times that, within ``max_entry_bytes``)."""
        entry = size_bytes * SERIALIZED_PER_BYTE
        return compile_s >= self.min_compile_s and entry <= self.max_entry_bytes

    def store_later(self, guide_key: Hashable, serialize: Callable[[], str]) -> None:
        """Serialize and store on the cache's writer thread (xgrammar releases the GIL while it
        serializes; a large grammar takes seconds, which no request should wait for). At most
        ``MAX_PENDING`` writes wait; more are dropped (the guide is compiled again next time)."""
        with self._lock:
            if self._pending >= MAX_PENDING:
                return
            self._pending += 1
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="guidedec-disk-cache")
            writer = self._writer
        writer.submit(self._write, guide_key, serialize)

    def flush(self) -> None:
        """Wait for the writes :meth:`store_later` queued."""
        with self._lock:
            writer = self._writer
        if writer is not None:
            writer.submit(lambda: None).result()

    def _write(self, guide_key: Hashable, serialize: Callable[[], str]) -> None:
        try:
            self.store(guide_key, serialize())
        except Exception as exc:  # a backend failing to serialize: nothing is kept
            logger.warning("cannot serialize a compiled grammar for the disk cache: %s", exc)
        finally:
            with self._lock:
                self._pending -= 1

    def store(self, guide_key: Hashable, payload: str) -> None:
        """Write the guide's entry atomically, then hold the directory to ``limit_bytes``."""
        data = payload.encode("utf-8")
        if len(data) > self.max_entry_bytes:
            return
        path = self._path(guide_key)
        key = path.name.removesuffix(SUFFIX)
        header = json.dumps({"format": FORMAT, "key": key, "bytes": len(data)}).encode() + b"\n"
        try:
            fd, temp = tempfile.mkstemp(dir=self.directory, prefix=TEMP_PREFIX, suffix=SUFFIX)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(header)
                    f.write(data)
                os.replace(temp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        except OSError as exc:  # a full or read-only disk: the cache is an optimisation
            logger.warning("cannot write the compile cache entry %s: %s", path.name, exc)
            return
        self.stats.stores += 1
        self._hold_to_limit(keep=path)

    def _path(self, guide_key: Hashable) -> Path:
        return self.directory / (self.key(guide_key) + SUFFIX)

    def _ignore(self, path: Path, reason: str) -> None:
        logger.warning("ignoring compile cache entry %s (%s); compiling instead", path.name, reason)
        self.stats.ignored += 1
        with contextlib.suppress(OSError):
            path.unlink()

    def _hold_to_limit(self, keep: Path) -> None:
        with self._lock:
            entries = []
            for path in self.directory.glob("*" + SUFFIX):
                if path.name.startswith(TEMP_PREFIX) or path == keep:
                    continue
                with contextlib.suppress(OSError):
                    info = path.stat()
                    entries.append((info.st_mtime, info.st_size, path))
            total = sum(size for _, size, _ in entries)
            with contextlib.suppress(OSError):  # another process may have removed it
                total += keep.stat().st_size
            for _, size, path in sorted(entries):
                if total <= self.limit_bytes:
                    break
                with contextlib.suppress(OSError):
                    path.unlink()
                    self.stats.evicted += 1
                total -= size
