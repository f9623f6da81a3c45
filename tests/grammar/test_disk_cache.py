"""The compile cache on disk: a second factory (a restarted server) reads what the first
compiled, with the same masks; a corrupt, truncated or foreign entry is ignored, the guide is
compiled and the entry written again; concurrent writers leave a whole entry; the directory
keeps to its byte budget. Oracle: the masks of a fresh compile, token by token."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from guidedec.bitmask import allocate_bitmask
from guidedec.cli import build_parser
from guidedec.grammar.cache import guide_cache_key
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.disk_cache import MAX_PENDING, SUFFIX, DiskCompileCache
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.grammar.xgrammar_backend import XGrammarMatcherFactory
from guidedec.tokenizer import TokenizerInfo

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{2,8}$"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "n": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": ["name", "n"],
    "additionalProperties": False,
}
INSTANCE = '{"name": "abc", "tags": ["a", "c"], "n": 42}'
GUIDE = GuidedDecodingParams(json_schema=SCHEMA)


def _factory(
    tokenizer: TokenizerInfo, directory: Path, **options: object
) -> XGrammarMatcherFactory:
    config = GuidedDecodingConfig(
        backend="xgrammar", tokenizer=tokenizer, compile_cache_dir=str(directory), **options
    )  # type: ignore[arg-type]
    factory = XGrammarMatcherFactory(config)
    assert factory.disk is not None
    factory.disk.min_compile_s = 0.0  # keep every compile (they are fast here)
    return factory


def _masks(factory: XGrammarMatcherFactory, tokenizer: TokenizerInfo) -> list[torch.Tensor]:
    """The masks along the instance's tokens, then the stop token's acceptance (the entry
    written, if the factory writes one)."""
    matcher = factory.create(GUIDE)
    if factory.disk is not None:
        factory.disk.flush()
    rows = allocate_bitmask(1, tokenizer.vocab_size)
    masks = []
    for token in [*tokenizer.encode(INSTANCE), tokenizer.eos_token_id]:
        matcher.fill_next_token_bitmask(rows, 0)
        masks.append(rows[0].clone())
        assert matcher.accept_token(token)
    assert matcher.is_terminated()
    return masks


def _entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*" + SUFFIX))


@pytest.fixture
def fresh(tokenizer: TokenizerInfo) -> list[torch.Tensor]:
    config = GuidedDecodingConfig(backend="xgrammar", tokenizer=tokenizer)
    return _masks(XGrammarMatcherFactory(config), tokenizer)


def test_a_restarted_factory_reads_the_compiled_grammar(
    tokenizer: TokenizerInfo, tmp_path: Path, fresh: list[torch.Tensor]
) -> None:
    first = _factory(tokenizer, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(_masks(first, tokenizer), fresh, strict=True))
    assert first.disk is not None and first.disk.stats.stores == 1
    assert len(_entries(tmp_path)) == 1
    second = _factory(tokenizer, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(_masks(second, tokenizer), fresh, strict=True))
    assert second.disk is not None
    assert (second.disk.stats.hits, second.disk.stats.stores) == (1, 0)


@pytest.mark.parametrize(
    "damage",
    ["truncated", "garbage payload", "wrong key", "other format", "not json", "empty"],
)
def test_a_damaged_entry_is_ignored_and_written_again(
    tokenizer: TokenizerInfo, tmp_path: Path, fresh: list[torch.Tensor], damage: str
) -> None:
    _masks(_factory(tokenizer, tmp_path), tokenizer)
    (entry,) = _entries(tmp_path)
    head, _, payload = entry.read_bytes().partition(b"\n")
    header = json.loads(head)
    if damage == "truncated":
        entry.write_bytes(head + b"\n" + payload[: len(payload) // 2])
    elif damage == "garbage payload":
        garbage = b"{" * len(payload)
        entry.write_bytes(head + b"\n" + garbage)
    elif damage == "wrong key":
        entry.write_bytes(json.dumps({**header, "key": "0" * 64}).encode() + b"\n" + payload)
    elif damage == "other format":
        entry.write_bytes(json.dumps({**header, "format": 99}).encode() + b"\n" + payload)
    elif damage == "not json":
        entry.write_bytes(b"\x00\xff" * 100)
    else:
        entry.write_bytes(b"")
    again = _factory(tokenizer, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(_masks(again, tokenizer), fresh, strict=True))
    assert again.disk is not None
    assert (again.disk.stats.hits, again.disk.stats.ignored, again.disk.stats.stores) == (0, 1, 1)
    third = _factory(tokenizer, tmp_path)  # the entry written again is whole
    _masks(third, tokenizer)
    assert third.disk is not None and third.disk.stats.hits == 1


def test_other_compile_options_do_not_share_an_entry(
    tokenizer: TokenizerInfo, tmp_path: Path
) -> None:
    _masks(_factory(tokenizer, tmp_path), tokenizer)
    compact = _factory(tokenizer, tmp_path, json_whitespace="compact")
    compact.create(GUIDE)
    assert compact.disk is not None
    compact.disk.flush()
    assert (compact.disk.stats.hits, compact.disk.stats.misses) == (0, 1)
    assert len(_entries(tmp_path)) == 2


def test_concurrent_writers_leave_a_whole_entry(tokenizer: TokenizerInfo, tmp_path: Path) -> None:
    factory = _factory(tokenizer, tmp_path)
    payload = factory.compile(GUIDE).serialize_json()
    key = guide_cache_key(GUIDE)
    caches = [DiskCompileCache(tmp_path, factory.disk.context) for _ in range(4)]  # type: ignore[union-attr]
    threads = [
        threading.Thread(target=lambda c=c: [c.store(key, payload) for _ in range(10)])
        for c in caches
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(_entries(tmp_path)) == 1
    assert not list(tmp_path.glob(".tmp-*"))
    assert caches[0].load(key, lambda text: text) == payload


def test_the_directory_keeps_to_its_budget(tmp_path: Path) -> None:
    cache = DiskCompileCache(tmp_path, "context", limit_bytes=2500)
    for i in range(5):
        for j in range(i):  # the older entries' ages, whatever the file system's clock grain
            path = tmp_path / (cache.key(("regex", f"r{j}")) + SUFFIX)
            if path.exists():
                os.utime(path, (1000 + j, 1000 + j))
        cache.store(("regex", f"r{i}"), "x" * 1000)
    kept = _entries(tmp_path)
    assert len(kept) == 2 and cache.stats.evicted == 3
    assert cache.load(("regex", "r4"), lambda text: text) == "x" * 1000  # the newest stay
    assert cache.load(("regex", "r0"), lambda text: text) is None


def test_cli_takes_the_directory(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--compile-cache-dir", str(tmp_path)])
    assert args.compile_cache_dir == str(tmp_path)


def test_a_factory_starts_whatever_the_tokenizer_has_built(tmp_path: Path) -> None:
    """The fingerprint is built under the tokenizer's lock, which the xgrammar tokenizer info
    takes too: a fresh tokenizer must not deadlock."""
    fresh = TokenizerInfo.from_tokenizer_json(TokenizerInfo.default().hf_tokenizer.name_or_path)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (_factory(fresh, tmp_path), done.set()), daemon=True)
    thread.start()
    assert done.wait(60)


def test_writes_wait_on_their_own_thread(tmp_path: Path) -> None:
    """A request does not wait for its grammar's entry to be written; past the queue's bound
    writes are dropped, and a failing serialization keeps nothing."""
    cache = DiskCompileCache(tmp_path, "context")
    release = threading.Event()

    def slow() -> str:
        release.wait(10)
        return "payload"

    start = time.monotonic()
    for i in range(MAX_PENDING + 2):
        cache.store_later(("regex", f"r{i}"), slow)
    assert time.monotonic() - start < 1.0
    release.set()
    cache.flush()
    assert cache.stats.stores == MAX_PENDING and len(_entries(tmp_path)) == MAX_PENDING
    assert cache.load(("regex", "r0"), lambda text: text) == "payload"
    cache.store_later(("regex", "bad"), lambda: str(1 / 0))
    cache.flush()
    assert cache.stats.stores == MAX_PENDING and len(_entries(tmp_path)) == MAX_PENDING
    cache.store_later(("regex", "after"), lambda: "later")  # the queue is free again
    cache.flush()
    assert cache.load(("regex", "after"), lambda text: text) == "later"
