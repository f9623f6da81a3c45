"""Guides, configuration, bad input, JSON whitespace control and the compile cache."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import (
    GrammarMatcherFactory,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    GuideType,
    TokenizerInfo,
    create_grammar_matcher_factory,
)
from guidedec.errors import GrammarError
from guidedec.grammar import host
from guidedec.grammar.cache import (
    KEPT_CANONICAL_CHARS,
    CompileCache,
    _canonical_text,
    _kept_canonical,
    canonical_json_schema,
)
from guidedec.testing import accepts_output


def test_params_need_exactly_one_guide() -> None:
    with pytest.raises(ValueError, match="exactly one guide"):
        GuidedDecodingParams()
    with pytest.raises(ValueError, match=r"\['json_object', 'regex'\]"):
        GuidedDecodingParams(json_object=True, regex="a")
    with pytest.raises(ValueError, match="sequence of strings"):
        GuidedDecodingParams(choice="abc")


def test_params_expose_type_and_guide_text() -> None:
    params = GuidedDecodingParams(json_schema={"type": "integer"})
    assert params.guide_type is GuideType.JSON_SCHEMA
    assert json.loads(str(params.guide)) == {"type": "integer"}
    assert params == GuidedDecodingParams(json_schema='{"type": "integer"}')
    assert hash(params) == hash(GuidedDecodingParams(json_schema='{"type": "integer"}'))
    assert GuidedDecodingParams(choice=["a", "b"]).guide == ("a", "b")
    assert GuidedDecodingParams(json_object=True).guide is None


BAD_GUIDES = [
    (GuidedDecodingParams(json_schema="{not json"), "not valid JSON"),
    (GuidedDecodingParams(json_schema={"type": "banana"}), "json_schema"),
    (GuidedDecodingParams(regex="[a-"), "regex"),
    (GuidedDecodingParams(ebnf='root ::= "a" ( "b"'), "ebnf"),
    (GuidedDecodingParams(ebnf='start ::= "a"'), "ebnf"),
    (GuidedDecodingParams(lark="start: ("), "lark"),
    (GuidedDecodingParams(choice=[]), "choice"),
    (GuidedDecodingParams(structural_tag='{"type": "structural_tag", "format": 3}'), "structural"),
]


@pytest.mark.parametrize(("params", "needle"), BAD_GUIDES)
def test_bad_guides_raise_grammar_error_naming_the_problem(
    factory: GrammarMatcherFactory, params: GuidedDecodingParams, needle: str
) -> None:
    with pytest.raises(GrammarError) as info:
        factory.create(params)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_backend_is_a_grammar_error(tokenizer: TokenizerInfo) -> None:
    with pytest.raises(GrammarError, match="unknown guided decoding backend 'outlines'"):
        GuidedDecodingConfig(backend="outlines", tokenizer=tokenizer)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_compact_json_allows_no_whitespace(
    backend: str, make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo
) -> None:
    factory = make_factory(backend, "compact")
    params = GuidedDecodingParams(json_schema={"type": "object", "properties": {"a": {}}})
    assert accepts_output(factory, tokenizer, params, '{"a":[1,{"b":2}]}')
    assert not accepts_output(factory, tokenizer, params, '{"a": 1}')
    assert not accepts_output(factory, tokenizer, params, '{"a":1 }')


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_flexible_json_bounds_each_whitespace_run(
    backend: str, make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo
) -> None:
    factory = make_factory(backend)
    params = GuidedDecodingParams(json_object=True)
    limit = 20
    indented = json.dumps({"a": [1, {"b": [2, 3]}], "c": "d"}, indent=2)
    assert accepts_output(factory, tokenizer, params, indented)
    assert accepts_output(factory, tokenizer, params, "{" + " \t\r\n" * 5 + '"a": 1}')
    assert not accepts_output(factory, tokenizer, params, "{" + " " * (limit + 1) + '"a": 1}')
    assert not accepts_output(factory, tokenizer, params, '{"a":' + "\n" * (limit + 1) + "1}")


def test_whitespace_limit_is_configurable(tokenizer: TokenizerInfo) -> None:
    for backend in ("xgrammar", "llguidance"):
        config = GuidedDecodingConfig(backend=backend, tokenizer=tokenizer, max_json_whitespace=2)
        factory = create_grammar_matcher_factory(config)
        params = GuidedDecodingParams(json_object=True)
        assert accepts_output(factory, tokenizer, params, '{ "a":  1}')
        assert not accepts_output(factory, tokenizer, params, '{   "a": 1}')


def test_canonical_schema_ignores_key_order_except_properties() -> None:
    a = '{"type": "object", "required": ["x"], "properties": {"x": {}, "y": {"type": "string"}}}'
    b = '{"properties": {"x": {}, "y": {"type":"string"}}, "required": ["x"], "type": "object"}'
    swapped = (
        '{"type": "object", "required": ["x"], "properties": {"y": {"type": "string"}, "x": {}}}'
    )
    assert canonical_json_schema(a) == canonical_json_schema(b)
    assert canonical_json_schema(a) != canonical_json_schema(swapped)
    const_a = '{"const": {"b": 1, "a": 2}}'
    assert canonical_json_schema(const_a) != canonical_json_schema('{"const": {"a": 2, "b": 1}}')
    assert canonical_json_schema("not json") == "not json"


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_compile_cache_hits_for_equivalent_schemas(backend: str, tokenizer: TokenizerInfo) -> None:
    config = GuidedDecodingConfig(backend=backend, tokenizer=tokenizer)
    factory = create_grammar_matcher_factory(config)
    cache = factory.cache  # type: ignore[attr-defined]
    factory.create(GuidedDecodingParams(json_schema='{"type": "object", "minProperties": 1}'))
    factory.create(GuidedDecodingParams(json_schema={"minProperties": 1, "type": "object"}))
    factory.create(GuidedDecodingParams(regex="a+"))
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 2, 2)
    assert 0 < stats.size_bytes <= config.cache_limit_bytes


def test_compile_cache_evicts_least_recently_used_within_its_byte_budget() -> None:
    cache: CompileCache[str] = CompileCache(limit_bytes=10)
    compiled: list[str] = []

    def get(key: str, size: int) -> str:
        def compile_fn() -> str:
            compiled.append(key)
            return key.upper()

        return cache.get_or_compile(key, compile_fn, lambda _: size)

    assert get("a", 4) == "A"
    get("b", 4)
    get("a", 4)  # hit: "a" becomes most recent
    get("c", 4)  # evicts "b"
    get("a", 4)
    get("b", 4)  # recompiled
    get("huge", 11)  # larger than the budget: returned, never kept
    get("huge", 11)
    assert compiled == ["a", "b", "c", "b", "huge", "huge"]
    stats = cache.stats()
    assert stats.size_bytes <= 10 and (stats.hits, stats.misses) == (2, 6)


def test_compile_cache_discards_one_entry_and_its_bytes() -> None:
    cache: CompileCache[str] = CompileCache(limit_bytes=10)
    for key, size in (("a", 3), ("b", 4)):
        cache.get_or_compile(key, key.upper, lambda _, size=size: size)
    assert cache.discard("a") == 3 and cache.discard("a") == 0 and cache.discard("zzz") == 0
    stats = cache.stats()
    assert (stats.entries, stats.size_bytes) == (1, 4)
    assert cache.get_or_compile("a", lambda: "again", lambda _: 3) == "again"  # compiled anew


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_a_forgotten_guide_is_compiled_again_and_its_memory_given_back(
    backend: str, tokenizer: TokenizerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []
    real = host._libc_function
    monkeypatch.setattr(
        host,
        "_libc_function",
        lambda name, restype: trims.append if name == "malloc_trim" else real(name, restype),
    )
    config = GuidedDecodingConfig(backend=backend, tokenizer=tokenizer)
    factory = create_grammar_matcher_factory(config)
    kept, dropped = GuidedDecodingParams(regex="a+"), GuidedDecodingParams(regex="b+")
    factory.compile(kept)
    factory.compile(dropped)
    factory.forget(dropped)
    assert trims == [0]  # malloc_trim(0), once: only the one backend that held it
    factory.forget(dropped)  # nothing left to drop: nothing to give back
    assert trims == [0]
    caches = (
        [factory.factory(name).cache for name in ("xgrammar", "llguidance")]  # type: ignore[attr-defined]
        if backend == "auto"
        else [factory.cache]  # type: ignore[attr-defined]
    )
    misses = sum(cache.stats().misses for cache in caches)
    factory.compile(kept)
    factory.compile(dropped)
    assert sum(cache.stats().misses for cache in caches) == misses + 1  # the forgotten one


def test_freed_memory_is_given_back_through_the_c_library() -> None:
    """On glibc, malloc_trim is found and called (returns 0 or 1); elsewhere nothing happens."""
    host.return_freed_memory()
    trim = host._libc_function("malloc_trim", ctypes.c_int)
    assert trim is None or trim(0) in (0, 1)


def test_tokenizer_info_defaults(tokenizer: TokenizerInfo) -> None:
    assert tokenizer.vocab_size == 129_280
    assert tokenizer.stop_token_ids == (1,)
    text = '{"name": "Ada"}'
    assert tokenizer.decode(tokenizer.encode(text)) == text
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        TokenizerInfo(tokenizer.hf_tokenizer, vocab_size=1000)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TokenizerInfo(tokenizer.hf_tokenizer, stop_token_ids=[10**7])
    padded = TokenizerInfo.from_huggingface(tokenizer.hf_tokenizer, vocab_size=129_312)
    assert padded.vocab_size == 129_312 and padded.real_vocab_size == 129_280


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [*'ab {}[]":,\n\t\\é漢🙂07 ', "<｜end▁of▁sentence｜>", "</think>", "<think>"]
        ),
        max_size=30,
    )
)
def test_encode_gives_the_transformers_tokenizer_s_ids(pieces: list[str]) -> None:
    """``encode`` calls the fast tokenizer's own object: the ids of the ``transformers``
    wrapper's ``encode`` without special tokens, special and added tokens' text included."""
    tokenizer = TokenizerInfo.default()
    text = "".join(pieces)
    expected = list(tokenizer.hf_tokenizer.encode(text, add_special_tokens=False))
    assert tokenizer.encode(text) == expected


def test_canonical_texts_of_schemas_up_to_the_limit_are_kept() -> None:
    small = json.dumps({"type": "object", "properties": {"b": {}, "a": {}}, "required": ["a"]})
    before = _kept_canonical.cache_info()
    assert canonical_json_schema(small) == canonical_json_schema(small) == _canonical_text(small)
    kept = _kept_canonical.cache_info()
    assert kept.hits >= before.hits + 1
    big = json.dumps({"enum": ["x" * 100] * 700})
    assert len(big) > KEPT_CANONICAL_CHARS
    assert canonical_json_schema(big) == _canonical_text(big)
    assert _kept_canonical.cache_info() == kept  # neither looked up nor kept


def test_a_guide_s_cache_key_is_computed_once_per_params_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large schema's canonical text is not kept (above); a request's params are keyed by
    auto, the backend's cache and closing, so the key is kept on the params object."""
    from guidedec.grammar import cache

    computed: list[str] = []
    monkeypatch.setattr(cache, "_canonical_text", lambda s: computed.append(s) or s.upper())
    big = json.dumps({"enum": ["x" * 100] * 700})
    params = GuidedDecodingParams(json_schema=big)
    key = cache.guide_cache_key(params)
    assert key == ("json_schema", big.upper())
    assert cache.guide_cache_key(params) is key and len(computed) == 1
    same = GuidedDecodingParams(json_schema=big)  # another request with the same schema
    assert cache.guide_cache_key(same) == key and len(computed) == 2
    assert same == params and "_cache_key" not in repr(params)
    regex = GuidedDecodingParams(regex="[a-z]+")
    assert cache.guide_cache_key(regex) == ("regex", "[a-z]+") and len(computed) == 2
