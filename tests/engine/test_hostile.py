"""The hostile-input suite through ``LLM.generate``: each hostile guide beside a healthy
request, at sizes that crashed or hung the engine before; the hostile request fails alone with
an error naming its problem, the healthy one is unchanged token for token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.decoder import GuidedDecoder
from guidedec.grammar.auto import AutoMatcherFactory
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import (
    GrammarMatcher,
    GrammarMatcherFactory,
    WrappedFactory,
)
from guidedec.testing import SlowMasks, uniform_guided_generate
from guidedec.tokenizer import TokenizerInfo

pytestmark = pytest.mark.timed_search  # slow masks: searches give up as in production

HEALTHY = GuidedDecodingParams(
    json_schema={
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
)


def _deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        node = {"type": "array", "items": node}
    return node


HOSTILE: dict[str, tuple[GuidedDecodingParams, str]] = {
    "xgrammar crash": (
        GuidedDecodingParams(
            json_schema={"type": "string", "pattern": "^" + "(" * 30000 + "a" + ")" * 30000 + "$"}
        ),
        "max_pattern_chars",
    ),
    "llguidance crash": (
        GuidedDecodingParams(
            json_schema={"type": "object", "required": [f"k{i}" for i in range(30000)]}
        ),
        "max_names",
    ),
    "hang": (GuidedDecodingParams(choice=[f"option {i}" for i in range(100_000)]), "max_values"),
    "ebnf rules": (
        GuidedDecodingParams(
            ebnf="root ::= r0\n" + "".join(f'r{i} ::= "x"\n' for i in range(20_000))
        ),
        "max_rules",
    ),
    "out of range": (
        GuidedDecodingParams(json_schema={"type": "integer", "minimum": 2**63}),
        "64-bit",
    ),
    "external ref": (
        GuidedDecodingParams(json_schema={"$ref": "http://example.com/schema.json"}),
        "external",
    ),
    "deep": (GuidedDecodingParams(json_schema=_deep(400)), "max_depth"),
    "slow masks": (
        GuidedDecodingParams(lark="start: /(a{700}){700}/"),
        "mask_time_limit_ms",
    ),
    "negative length": (
        GuidedDecodingParams(json_schema={"type": "string", "maxLength": -1}),
        "must not be negative",
    ),
    # llguidance compiles it, then refuses to lex at the first token, inside closing's check of
    # the sampled token (this failed the whole engine step once).
    "unlexable pattern": (
        GuidedDecodingParams(json_schema={"type": "string", "pattern": "^a{1000000}$"}),
        "too many expressions constructed",
    ),
}


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    # No guide here is refused by the compile timeout; a generous one keeps a busy machine from
    # turning the slow-mask guide's probe (its first mask takes seconds) into a timeout.
    engine = LLM("tiny-random", max_num_seqs=2, compile_timeout_s=60)
    yield engine
    engine.close()


def _healthy() -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=1.0, seed=3, guided_decoding=HEALTHY)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_guide_fails_alone(llm: LLM, name: str) -> None:
    guide, message = HOSTILE[name]
    alone = llm.generate(["A record:"], [_healthy()])[0]
    hostile, beside = llm.generate(
        ["Oops:", "A record:"], [SamplingParams(max_tokens=8, guided_decoding=guide), _healthy()]
    )
    assert hostile.finish_reason == "grammar_error"
    assert message in (hostile.error or ""), hostile.error
    assert beside.token_ids == alone.token_ids
    assert beside.finish_reason == alone.finish_reason


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_strided_bitmask_is_refused(backend: str) -> None:
    """xgrammar used to write a strided bitmask as if it were contiguous (a wrong mask)."""
    tokenizer = TokenizerInfo.default()
    config = GuidedDecodingConfig(backend=backend, tokenizer=tokenizer)  # type: ignore[arg-type]
    matcher = create_grammar_matcher_factory(config).create(GuidedDecodingParams(regex="[ab]+"))
    words = (tokenizer.vocab_size + 31) // 32
    wide = torch.zeros(4, 2 * words, dtype=torch.int32)
    with pytest.raises(ValueError, match="contiguous"):
        matcher.fill_next_token_bitmask(wide[:, ::2], 0)


def test_the_mask_time_limit_is_configurable_and_checked() -> None:
    with pytest.raises(ValueError, match="mask_time_limit_ms"):
        GuidedDecodingConfig(tokenizer=TokenizerInfo.default(), mask_time_limit_ms=0)
    engine = LLM("tiny-random", max_num_seqs=1, mask_time_limit_ms=None, isolate_compiles=False)
    try:
        guide = GuidedDecodingParams(lark="start: /(a{700}){700}/")
        out = engine.generate(["x"], [SamplingParams(max_tokens=3, guided_decoding=guide)])[0]
    finally:
        engine.close()
    assert out.finish_reason == "length" and len(out.token_ids) == 3  # slow, not refused
    assert set(out.text) == {"a"}


class _SlowFactory(WrappedFactory):
    def __init__(self, inner: GrammarMatcherFactory, slow: set[int]) -> None:
        super().__init__(inner)
        self.slow = slow
        self.made: list[SlowMasks] = []
        self.forgotten: list[GuidedDecodingParams] = []

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        self.made.append(SlowMasks(self.inner.create(params), 0.03, at=self.slow))
        return self.made[-1]

    def forget(self, params: GuidedDecodingParams) -> None:
        self.forgotten.append(params)
        super().forget(params)


@pytest.mark.parametrize(
    ("slow", "fails"),
    [
        ({1, 2, 4, 5, 7, 8}, False),  # a slow first fill, then never three slow in a row
        # A slow build turns timing on: fills 3 to 5 are timed, and fail (2 to 4 when the first
        # build, a new matcher's first mask, took over FILL_TIMING_S already).
        ({2, 3, 4, 5}, True),
    ],
)
def test_masks_slow_three_times_in_a_row_fail_the_request(
    tokenizer: TokenizerInfo, slow: set[int], fails: bool
) -> None:
    config = GuidedDecodingConfig(tokenizer=tokenizer, mask_time_limit_ms=20)
    factory = _SlowFactory(create_grammar_matcher_factory(config), slow)
    decoder = GuidedDecoder(config=config, factory=factory, max_num_sequences=1)
    guide = GuidedDecodingParams(regex="[ab]{60}")
    (out,) = uniform_guided_generate(decoder, [guide], max_tokens=60)
    (matcher,) = factory.made
    if fails:
        assert out.error is not None and "mask_time_limit_ms" in out.error
        assert matcher.fills in (4, 5) and len(out.token_ids) == matcher.fills - 1
        # The guide would fail every request: the factory drops it (a later one compiles anew).
        assert factory.forgotten == [guide]
        auto = factory.inner
        assert isinstance(auto, AutoMatcherFactory)
        caches = [auto.factory(name).cache for name in ("xgrammar", "llguidance")]  # type: ignore[attr-defined]
        misses = sum(cache.stats().misses for cache in caches)
        factory.compile(guide)
        assert sum(cache.stats().misses for cache in caches) == misses + 1
    else:
        assert out.error is None and out.finished and matcher.fills > max(slow)
        assert factory.forgotten == []
