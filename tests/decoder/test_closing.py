"""Budget-aware closing: the completion search over the matcher API, and the engine's outputs.

Oracles: the matcher itself (a witness is accepted token by token and ends the guide, and the
matcher is back in its state afterwards), ``json.loads`` / ``jsonschema`` / ``re.fullmatch`` on
the outputs, and the same engine with closing off, token for token, for outputs that finish
inside their budget.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema
import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.cases import COMMITTING_CASES, COMMITTING_GRAMMARS, JSON_CASES
from guidedec.bitmask import allocate_bitmask
from guidedec.decoder.closing import THINK_ROOM, WINDOW, BudgetCloser, CompletionSearch, completes
from guidedec.decoder.closing.settings import MAX_DEPTH, SLOW_SEARCH_S
from guidedec.decoder.closing.witness import rests as witness_rests
from guidedec.decoder.request import GuidedRequest
from guidedec.grammar.guide_words import guide_words
from guidedec.grammar.matcher import (
    GrammarMatcher,
    GrammarMatcherFactory,
    WrappedFactory,
    WrappedMatcher,
)
from guidedec.testing import SlowMasks
from guidedec.tokenizer import TokenizerInfo

BACKENDS = ["xgrammar", "llguidance", "auto"]
OTHER_GUIDES = [
    (GuidedDecodingParams(regex=r"(ab)*c[0-9]{3}"), "ababab"),
    (GuidedDecodingParams(choice=["yes please", "no thanks", "maybe later"]), "may"),
    (GuidedDecodingParams(ebnf='root ::= "(" expr ")"\nexpr ::= [0-9]+ | "(" expr ")"'), "((1"),
    (GuidedDecodingParams(lark='start: "key=" /[a-z]+/ ";" "end"'), "key=abc"),
]

NAME_AGE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def search(tokenizer: TokenizerInfo) -> CompletionSearch:
    return CompletionSearch(tokenizer)


def _prefixes(tokenizer: TokenizerInfo) -> list[tuple[GuidedDecodingParams, list[int]]]:
    """Every guide with prefixes of a valid text: every 4th token of the JSON instances."""
    out = []
    for schema, instance in JSON_CASES:
        tokens = tokenizer.encode(json.dumps(instance))
        params = GuidedDecodingParams(json_schema=schema)
        out += [(params, tokens[:cut]) for cut in range(0, len(tokens), 4)]
    for params, text in OTHER_GUIDES:
        tokens = tokenizer.encode(text)
        out += [(params, tokens[:cut]) for cut in range(len(tokens) + 1)]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_witness_completes_the_guide_and_leaves_the_matcher_as_it_was(
    backend: str,
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    search: CompletionSearch,
) -> None:
    factory = make_factory(backend)
    rows = allocate_bitmask(2, tokenizer.vocab_size)
    lengths = []
    for params, prefix in _prefixes(tokenizer):
        matcher = factory.create(params)
        assert all(matcher.accept_token(t) for t in prefix)
        matcher.fill_next_token_bitmask(rows, 0)
        witness = search.witness(matcher, 48, words=guide_words(params, tokenizer))
        assert witness is not None, (params, tokenizer.decode(prefix))
        matcher.fill_next_token_bitmask(rows, 1)
        assert torch.equal(rows[0], rows[1])  # the search rolled everything back
        assert witness[-1] in tokenizer.stop_token_ids and len(witness) <= 48
        assert all(matcher.accept_token(t) for t in witness) and matcher.is_terminated()
        lengths.append(len(witness))
    assert sorted(lengths)[len(lengths) // 2] <= 12  # short completions, not the limit


class _CountingMatcher(WrappedMatcher):
    """Counts the mask fills of the matcher it wraps."""

    def __init__(self, inner: GrammarMatcher) -> None:
        super().__init__(inner)
        self.fills = 0

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        self.fills += 1
        self.inner.fill_next_token_bitmask(bitmask, index)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_the_probe_finds_short_witnesses_with_few_mask_fills(
    backend: str,
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    search: CompletionSearch,
) -> None:
    """Oracle: the search proper (a mask at every state). The probe's witnesses are valid,
    about as short, and most of them cost no mask fill at all."""
    factory = make_factory(backend)
    probed, searched, fills, none, plain_fills = 0, 0, [], 0, 0
    for params, prefix in _prefixes(tokenizer):
        matcher = _CountingMatcher(factory.create(params))
        assert all(matcher.accept_token(t) for t in prefix)
        words = guide_words(params, tokenizer)
        plain = search.witness(matcher, 48, words=words, probe=False)
        plain_fills, matcher.fills = plain_fills + matcher.fills, 0
        witness = search.witness(matcher, 48, words=words)
        assert witness is not None and plain is not None
        fills.append(matcher.fills)
        none += matcher.fills == 0
        assert all(matcher.accept_token(t) for t in witness) and matcher.is_terminated()
        probed, searched = probed + len(witness), searched + len(plain)
    assert none >= 0.5 * len(fills) and sum(fills) * 4 < plain_fills, (fills, plain_fills)
    assert probed <= 1.15 * searched, (probed, searched)


def test_no_witness_within_too_small_a_limit(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    search: CompletionSearch,
) -> None:
    params = GuidedDecodingParams(json_schema={"type": "array", "minItems": 50})
    matcher = make_factory("xgrammar").create(params)
    assert search.witness(matcher, 8) is None
    assert search.nodes <= 8 * 8 + 16  # bounded
    assert search.witness(matcher, 160) is not None  # "[0,0,...]" fits in 160


def test_a_long_limit_searches_no_deeper_than_max_depth_and_the_probe_follows_long_witnesses(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    search: CompletionSearch,
) -> None:
    """The search proper recurses per token: with a limit of thousands (a window sized from a
    long reach) it stops at ``MAX_DEPTH`` instead of the interpreter's recursion limit, which
    used to leave the matcher hundreds of tokens ahead. The probe, a loop, still finds a
    witness longer than that."""
    endless = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    matcher = make_factory("xgrammar").create(GuidedDecodingParams(json_schema=endless))
    before = _mask(matcher, tokenizer.vocab_size)
    search.witness(matcher, 4000)  # whatever xgrammar's recursion allows; it must not raise
    assert search.nodes <= 2 * 4000 + 8 * MAX_DEPTH + 16
    assert np.array_equal(_mask(matcher, tokenizer.vocab_size), before)  # left as it was
    long = {"type": "array", "items": {"type": "integer"}, "minItems": 300}
    matcher = make_factory("xgrammar").create(GuidedDecodingParams(json_schema=long))
    witness = search.witness(matcher, 1000)
    assert witness is not None and MAX_DEPTH < len(witness) <= 1000
    assert all(matcher.accept_token(t) for t in witness) and matcher.is_terminated()


def _mask(matcher: GrammarMatcher, vocab_size: int) -> npt.NDArray[np.int32]:
    rows = allocate_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(rows, 0)
    return rows[0].numpy().copy()


@pytest.mark.timed_search
def test_a_search_over_slow_masks_gives_up(
    make_factory: Callable[..., GrammarMatcherFactory], search: CompletionSearch
) -> None:
    """A witness needs several masks here (the probe's candidates do not spell the key); at
    20 ms each the search gives up past SLOW_SEARCH_S instead of stalling its batch."""
    params = GuidedDecodingParams(regex="qzx[a-z]{3}wvk")
    matcher = make_factory("xgrammar").create(params)
    found = search.witness(matcher, 32)
    assert found is not None and not search.gave_up
    slow = SlowMasks(matcher, 0.02)  # 20 ms a mask, as llguidance's on a nested Lark repetition
    began = time.perf_counter()
    assert search.witness(slow, 32) is None and search.gave_up
    took = time.perf_counter() - began
    assert took < SLOW_SEARCH_S + 4 * 0.02 and search.nodes <= 4
    assert search.witness(matcher, 32) == found and not search.gave_up  # state unchanged


def test_guide_words_name_the_keys_and_literals(tokenizer: TokenizerInfo) -> None:
    schema = {
        "type": "object",
        "properties": {"kind": {"enum": ["alpha"]}, "zeta": {"type": "integer"}},
        "required": ["zeta"],
    }
    words = guide_words(GuidedDecodingParams(json_schema=schema), tokenizer)
    expected = tokenizer.encode("zeta") + tokenizer.encode("kind") + tokenizer.encode("alpha")
    assert words == list(dict.fromkeys(expected))  # required keys first
    regex = guide_words(GuidedDecodingParams(regex=r"id-[0-9]+ (done|open)"), tokenizer)
    assert set(regex) == {t for w in ("id", "done", "open") for t in tokenizer.encode(w)}
    assert guide_words(GuidedDecodingParams(json_object=True), tokenizer) == []


def test_guide_words_read_keyword_named_properties_as_names(tokenizer: TokenizerInfo) -> None:
    # BFCL tools name arguments "format", "enum", "required": their schemas are dicts where a
    # keyword's value would be a string or a list
    keywords = ("format", "enum", "const", "required")
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in keywords}}
    words = guide_words(GuidedDecodingParams(json_schema=schema), tokenizer)
    assert set(words) == {t for k in keywords for t in tokenizer.encode(k)}


CALL_BEGIN = '<tool_call>\n{"name": "get_weather", "arguments": '
CALLS_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "tags_with_separator",
        "tags": [
            {
                "type": "tag",
                "begin": CALL_BEGIN,
                "content": {"type": "json_schema", "json_schema": NAME_AGE},
                "end": "}\n</tool_call>",
            }
        ],
        "separator": "\n",
        "at_least_one": True,
    },
}


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_structural_tag_s_fixed_texts_are_its_words_and_close_it_in_few_tokens(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo, backend: str
) -> None:
    """A tool call's opening is fixed text: its tokens, first among the words, let a tight
    budget spell it as the tokenizer does rather than a character at a time."""
    params = GuidedDecodingParams(structural_tag=CALLS_TAG)
    words = guide_words(params, tokenizer)
    opening = tokenizer.encode(CALL_BEGIN)
    names = tokenizer.encode("name") + tokenizer.encode("age")
    assert set(opening) <= set(words) and set(names) <= set(words)
    assert max(words.index(t) for t in opening) < words.index(tokenizer.encode("age")[0])
    whole = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"name": "", "age": 0}}\n</tool_call>'
    )
    limit = len(tokenizer.encode(whole)) + 2
    matcher = make_factory(backend).create(params)
    found = CompletionSearch(tokenizer).witness(matcher, limit, words=words)
    assert found is not None and len(found) <= limit
    assert tokenizer.decode(found).startswith(CALL_BEGIN)
    assert all(matcher.accept_token(t) for t in found) and matcher.is_terminated()


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_witness_writes_the_shortest_enum_value_and_choice(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    search: CompletionSearch,
    backend: str,
) -> None:
    """Seven items of an enum whose first value is long: the guide's words list the short
    value first, so the witness spells ``["x","x",...]`` (16 tokens), where it spelled the long
    value seven times (58 tokens) and found nothing within 41. A choice's short option, listed
    second, is its witness within 8 tokens too."""
    params = GuidedDecodingParams(
        json_schema={"type": "array", "items": {"enum": ["zxxyzyxxyxzx", "x"]}, "minItems": 7}
    )
    words = guide_words(params, tokenizer)
    assert words[0] == tokenizer.encode("x")[0]
    witness = search.witness(make_factory(backend).create(params), 41, words=words)
    assert witness is not None and len(witness) <= 20
    assert tokenizer.decode(witness[:-1]) == json.dumps(["x"] * 7, separators=(",", ":"))
    choice = GuidedDecodingParams(choice=["a much longer answer than that", "short"])
    witness = search.witness(
        make_factory(backend).create(choice), 8, words=guide_words(choice, tokenizer)
    )
    assert witness is not None and tokenizer.decode(witness[:-1]) == "short"


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_witness_from_inside_a_repeated_literal_spells_its_rest(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    search: CompletionSearch,
    backend: str,
) -> None:
    """Seventeen ``a`` s into copies of ``aaaaaaaa`` (one token), seven more end a copy: two
    tokens (``aaaa`` ``aaa``) that are no word of the grammar but rests of its literal, after
    each of which the mask is what it was (a count the mask does not show). The search found
    nothing within 3 tokens before the rests were words and the last pass allowed such steps."""
    params = GuidedDecodingParams(ebnf='root ::= ("aaaaaaaa"){0,}')
    words = guide_words(params, tokenizer)
    assert set(tokenizer.encode("aaaaaaa")) <= set(words)
    matcher = make_factory(backend).create(params)
    assert all(matcher.accept_token(t) for t in tokenizer.encode("aaaaaaaa") * 2)
    assert matcher.accept_token(tokenizer.encode("a")[0])
    witness = search.witness(matcher, 3, words=words)
    assert witness is not None and tokenizer.decode(witness[:-1]) == "a" * 7
    assert matcher.completes(witness)


# --- the engine --------------------------------------------------------------------------------

SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"},
        },
        "required": ["title", "tags", "score"],
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "label": {"type": "string"}},
            "required": ["id", "label"],
        },
    },
]


def _budget_run(close: bool, backend: str = "auto") -> list[tuple[dict, object]]:
    llm = LLM("tiny-random", backend=backend, max_num_seqs=24)
    prompts, params = [], []
    for i, schema in enumerate(SCHEMAS):
        for max_tokens in (24, 40, 64):
            for seed in range(8):
                prompts.append(f"Write JSON {i}:")
                params.append(
                    SamplingParams(
                        max_tokens=max_tokens,
                        temperature=1.0,
                        seed=seed,
                        guided_decoding=GuidedDecodingParams(json_schema=schema),
                        close_within_budget=close,
                    )
                )
    outputs = llm.generate(prompts, params)
    llm.close()
    return list(zip([s for s in SCHEMAS for _ in range(24)], outputs, strict=True))


@pytest.mark.parametrize("backend", ["auto", "xgrammar", "llguidance"])
def test_every_output_completes_within_its_budget(backend: str) -> None:
    """tiny-random at temperature 1 with unbounded strings and numbers: with closing, every
    output ends complete (by itself, or closed: ``length`` with ``closed_from``) within
    ``max_tokens`` and validates; without it, most are cut."""
    for schema, out in _budget_run(True, backend):
        assert out.complete, out.text
        assert len(out.token_ids) <= 64 and out.incomplete is None
        jsonschema.validate(json.loads(out.text), schema)
    if backend == "auto":
        cut = [o for _, o in _budget_run(False) if o.finish_reason == "length"]
        assert len(cut) > 48
        assert all("closing off" in (o.incomplete or "") for o in cut)


def _finishing_early(close: bool, **options: object) -> tuple[list[tuple[list[int], str]], int]:
    llm = LLM(
        "tiny-random", max_num_seqs=4, dtype=torch.float64, json_whitespace="compact", **options
    )  # type: ignore[arg-type]
    guides = [
        GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,3}"),
        GuidedDecodingParams(choice=["alpha", "beta gamma"]),
        GuidedDecodingParams(
            json_schema={
                "type": "object",
                "properties": {"a": {"type": "boolean"}},
                "required": ["a"],
                "additionalProperties": False,
            }
        ),
        GuidedDecodingParams(ebnf='root ::= "x" [0-9] [0-9]? ";"'),
    ]
    params = [
        SamplingParams(
            max_tokens=m, temperature=t, seed=i, guided_decoding=g, close_within_budget=close
        )
        for i, g in enumerate(guides)
        for m, t in ((20, 0.0), (20, 1.0), (300, 1.0))
    ]
    outputs = llm.generate([f"Prompt {i}" for i in range(len(params))], params)
    llm.close()
    return [(o.token_ids, o.finish_reason) for o in outputs], llm.decoder.closer.stats.searches


@pytest.mark.parametrize(
    "options", [{}, {"speculative": "ngram", "num_draft_tokens": 3}], ids=["plain", "ngram"]
)
def test_outputs_that_finish_inside_the_budget_are_unchanged(options: dict[str, object]) -> None:
    """Short guides finish inside every budget (searches run for the 20-token ones, but never
    force a token): closing on and off give the same tokens (float64)."""
    on, searches = _finishing_early(True, **options)
    assert all(reason == "stop" and len(tokens) <= 12 for tokens, reason in on)
    assert searches > 0  # closing searched (and rolled back) on the 20-token requests
    assert _finishing_early(False, **options) == (on, 0)


def test_a_budget_no_completion_fits_says_so() -> None:
    llm = LLM("tiny-random", max_num_seqs=2)
    guide = GuidedDecodingParams(json_schema={"type": "array", "minItems": 50})
    free = GuidedDecodingParams(regex="[a-z]{1,40}")
    outputs = llm.generate(
        ["a", "b"],
        [
            SamplingParams(max_tokens=8, temperature=1.0, seed=1, guided_decoding=guide),
            SamplingParams(max_tokens=8, temperature=1.0, seed=2, guided_decoding=free),
        ],
    )
    assert outputs[0].finish_reason == "length"
    assert "no completion of its guide fitted" in (outputs[0].incomplete or "")
    assert "8 tokens (max_tokens)" in (outputs[0].incomplete or "")
    assert outputs[1].complete and outputs[1].incomplete is None
    assert re.fullmatch("[a-z]{1,40}", outputs[1].text)
    assert llm.decoder.closer.stats.no_fit >= 1


def test_json_numbers_stop_growing_past_the_digit_bound() -> None:
    """An unbounded integer under a weak model runs to its budget in digits; with closing on,
    an output holds at most ``MAX_DIGIT_RUN`` digits in a row (plus what the last digit token
    adds) and still validates."""
    from guidedec.decoder.row_rules import MAX_DIGIT_RUN

    guide = GuidedDecodingParams(json_schema={"type": "integer"})

    def run(close: bool) -> list[str]:
        llm = LLM("tiny-random", max_num_seqs=8)
        params = [
            SamplingParams(
                max_tokens=120,
                temperature=1.0,
                seed=s,
                guided_decoding=guide,
                close_within_budget=close,
            )
            for s in range(8)
        ]
        texts = [o.text for o in llm.generate(["Number:"] * 8, params)]
        llm.close()
        return texts

    bounded = run(True)
    assert all(len(t.strip().lstrip("-")) <= MAX_DIGIT_RUN + 2 for t in bounded), bounded
    assert all(isinstance(json.loads(t), int) for t in bounded)
    assert max(len(t) for t in run(False)) > MAX_DIGIT_RUN + 2  # the bound did something


def test_a_guide_no_completion_fits_is_searched_once() -> None:
    """A failed search costs its whole budget: a request is not searched again after one, and
    a guide whose start had no completion within N tokens is not searched from there again."""
    llm = LLM("tiny-random", max_num_seqs=8)
    guide = GuidedDecodingParams(json_schema={"type": "array", "minItems": 40})
    params = [
        SamplingParams(max_tokens=30, temperature=1.0, seed=s, guided_decoding=guide)
        for s in range(8)
    ]
    outputs = llm.generate(["List:"] * 8, params)
    llm.close()
    assert all(o.finish_reason == "length" and o.incomplete for o in outputs)
    stats = llm.decoder.closer.stats
    assert stats.searches == 1 and stats.no_fit == 8


def test_a_guide_s_recent_witnesses_are_replayed_before_a_search(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo
) -> None:
    """A second output at the same state replays the first one's witness (exact: the matcher
    accepts it and ends); at another state the kept witness does not complete and a search
    runs."""
    params = GuidedDecodingParams(json_schema=NAME_AGE)
    factory = make_factory("xgrammar")
    closer = BudgetCloser(tokenizer, num_slots=3)

    def at(text: str) -> GrammarMatcher:
        matcher = factory.create(params)
        assert all(matcher.accept_token(t) for t in tokenizer.encode(text))
        return matcher

    token = tokenizer.encode("x")[0]
    assert closer.admits(0, at('{"name": "ab'), params, token, 40)
    assert closer.stats.searches == 1 and closer.stats.recent_hits == 0
    assert closer.admits(1, at('{"name": "cd'), params, token, 40)
    assert closer.stats.searches == 1 and closer.stats.recent_hits == 1
    assert closer.admits(2, at('{"name": "x", "age": 1'), params, tokenizer.encode("2")[0], 40)
    assert closer.stats.searches == 2


class _CountingFactory(WrappedFactory):
    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        return _CountingFills(self.inner.create(params))


class _CountingFills(WrappedMatcher):
    fills = 0

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        type(self).fills += 1
        self.inner.fill_next_token_bitmask(bitmask, index)

    def advance_and_fill(self, token: int, bitmask: torch.Tensor, index: int) -> int:
        type(self).fills += 1
        return self.inner.advance_and_fill(token, bitmask, index)


@pytest.mark.parametrize("fill_mode", ["sequential", "parallel"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forced_row_is_written_without_a_fill_and_changes_no_output(
    backend: str, fill_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row that closing forces to its witness's next token (the output took the witness's
    token before) is written as that one token, with no mask fill: the same outputs as filling
    it and then forcing it, one fill fewer per such row."""
    from guidedec.grammar.factory import create_grammar_matcher_factory
    from guidedec.testing import EngineChecks, make_decoder, uniform_guided_generate

    guides = [GuidedDecodingParams(json_schema=schema) for schema in SCHEMAS]
    guides += [params for params, _ in OTHER_GUIDES]

    def run() -> tuple[list[object], int, int]:
        decoder = make_decoder(backend=backend, max_num_sequences=8, fill_mode=fill_mode)  # type: ignore[arg-type]
        inner = create_grammar_matcher_factory(decoder.config)
        decoder.factory = _CountingFactory(inner)
        _CountingFills.fills = 0
        outputs = []
        for i, guide in enumerate(guides):
            outputs += uniform_guided_generate(
                decoder, [guide] * 8, seed=i, max_tokens=24, checks=EngineChecks()
            )
        return outputs, decoder.closer.stats.forced_rows, _CountingFills.fills

    skipped, forced, fills = run()
    assert forced > 50
    monkeypatch.setattr(BudgetCloser, "forced_next", lambda self, req: None)
    filled, forced_filling, fills_filling = run()
    assert skipped == filled
    assert forced == forced_filling
    # A forced row skips its fill unless close had to find the witness after the fill (a
    # token sampled unchecked, drafts verified).
    assert fills_filling - forced <= fills < fills_filling


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("written", ["na", "{\n"])
def test_the_witness_s_text_in_another_split_is_encoded_again_not_searched(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    backend: str,
    written: str,
) -> None:
    """The model writes the start of the witness's text in tokens of its own (``na`` where the
    witness has ``name``), or whitespace after its structural character: the rest of the
    witness's text, encoded again, completes the new state, found without a search."""
    params = GuidedDecodingParams(json_schema=NAME_AGE)
    factory = make_factory(backend)
    closer = BudgetCloser(tokenizer, num_slots=1)
    matcher = factory.create(params)
    prefix = "" if written.startswith("{") else '{"'
    assert all(matcher.accept_token(t) for t in tokenizer.encode(prefix))
    # The slot's witness for the state at ``prefix``: found by a search.
    (token,) = tokenizer.encode(written)
    witness = closer.witnesses.find(params, matcher, 40)
    assert witness is not None
    closer._slots[0].witness = witness
    text = tokenizer.decode(witness[:-1])
    assert text.startswith(written.rstrip()) and tokenizer.encode(text)[0] != token
    searches = closer.stats.searches
    assert closer.admits(0, matcher, params, token, 40)
    assert closer.stats.searches == searches and closer.stats.respelled == 1
    assert closer.stats.recent_hits == 0
    found = closer._slots[0].after
    assert found is not None and found[0] == token
    assert matcher.accept_token(token)
    assert completes(matcher, found[1])  # the respelled witness completes the new state


class _CountingCompletes(WrappedMatcher):
    calls = 0

    def completes(self, tokens: Sequence[int]) -> bool:
        type(self).calls += 1
        return self.inner.completes(tokens)


def _closed_row(
    closer: BudgetCloser, matcher: GrammarMatcher, request: GuidedRequest, vocab_size: int
) -> npt.NDArray[np.int32]:
    """The request's row, filled for the matcher's state and passed through ``close``."""
    rows = allocate_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(rows, 0)
    words = rows[0].numpy()
    closer.close(request, matcher, words)
    return words


LONG_NAME = "b" * 40
COMMITTING_NAME = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        LONG_NAME: {"type": "array", "items": {"type": "integer"}, "minItems": 25},
    },
    "additionalProperties": False,
}


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_string_content_that_commits_to_a_long_value_is_checked(
    make_factory: Callable[..., GrammarMatcherFactory], backend: str
) -> None:
    """A token inside a property name chooses the names that begin with it: after ``"b`` the
    output owes the rest of a 40-character name and an array of at least 25 items, more than a
    48-token budget holds once a few tokens are spent, though ``{}`` fits it. Such a token is
    checked like a structural one, whatever room the output had, so every output ends within
    its budget and validates (while string content with room to spare went unchecked, about a
    third of these outputs were cut)."""
    from guidedec.testing import EngineChecks, make_decoder, uniform_guided_generate

    decoder = make_decoder(backend=backend, factory=make_factory(backend), max_num_sequences=16)
    guide = GuidedDecodingParams(json_schema=COMMITTING_NAME)
    outputs = []
    for seed in range(2):
        outputs += uniform_guided_generate(
            decoder, [guide] * 16, seed=seed, max_tokens=48, checks=EngineChecks()
        )
    _assert_complete_and_valid(decoder, outputs, COMMITTING_NAME)
    assert decoder.closer.stats.resampled > 0  # tokens of the long name were drawn again


def _assert_complete_and_valid(
    decoder: Any, outputs: Sequence[Any], schema: dict[str, Any]
) -> None:
    """Every output ended with a stop token, without an error, and validates."""
    texts = [decoder.config.tokenizer.decode(out.token_ids) for out in outputs]
    assert all(out.finished and out.error is None for out in outputs), [t[-80:] for t in texts]
    for text in texts:
        jsonschema.validate(json.loads(text), schema)


DEEP_COMMITMENT, _ = COMMITTING_CASES["a name owing 100 items"]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_name_that_commits_to_more_than_the_default_window_is_checked_from_the_start(
    make_factory: Callable[..., GrammarMatcherFactory], backend: str
) -> None:
    """After ``"b`` the output owes an array of at least 100 items, more than the 90 tokens a
    request has: the guide's window is sized from its reach (past the budget here), so that
    name is checked and drawn again from the first token, and every output ends within its
    budget (with the 64-token window, about half of these outputs ended ``length``)."""
    from guidedec.testing import EngineChecks, make_decoder, uniform_guided_generate

    decoder = make_decoder(backend=backend, factory=make_factory(backend), max_num_sequences=16)
    guide = GuidedDecodingParams(json_schema=DEEP_COMMITMENT)
    assert decoder.closer.window(guide) > 100
    outputs = uniform_guided_generate(
        decoder, [guide] * 16, seed=0, max_tokens=90, checks=EngineChecks()
    )
    _assert_complete_and_valid(decoder, outputs, DEEP_COMMITMENT)
    assert decoder.closer.stats.resampled > 0  # "b was drawn again


NESTED_MIN_ITEMS, _ = COMMITTING_CASES["30 arrays of 30 integers"]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_guide_that_owes_hundreds_of_tokens_closes_within_a_long_budget(
    make_factory: Callable[..., GrammarMatcherFactory], backend: str
) -> None:
    """Thirty arrays of thirty integers: any output owes about a thousand tokens, so its window
    (thousands of tokens) starts at its first row, and its witness, longer than the search's
    ``MAX_DEPTH``, comes from the probe. Every output ends complete within 2,048 tokens (with
    the 64-token window, each ran out of its budget)."""
    from guidedec.testing import EngineChecks, make_decoder, uniform_guided_generate

    decoder = make_decoder(backend=backend, factory=make_factory(backend), max_num_sequences=2)
    guide = GuidedDecodingParams(json_schema=NESTED_MIN_ITEMS)
    assert decoder.closer.window(guide) > 2048
    outputs = uniform_guided_generate(
        decoder, [guide] * 2, seed=0, max_tokens=2048, checks=EngineChecks()
    )
    _assert_complete_and_valid(decoder, outputs, NESTED_MIN_ITEMS)


COMMITTING_ITEM, _ = COMMITTING_GRAMMARS["an EBNF item owing 100 tokens"]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_an_ebnf_item_that_commits_to_more_than_the_default_window_is_checked_from_the_start(
    make_factory: Callable[..., GrammarMatcherFactory], backend: str
) -> None:
    """After a ``z`` the output owes a hundred ``0`` s, more than the 90 tokens a request has:
    the grammar's window is sized from its reach, so ``z`` is drawn again from the first token
    and every output ends complete (with the 64-token window, 2 of these 16 did)."""
    from guidedec.testing import EngineChecks, make_decoder, uniform_guided_generate

    decoder = make_decoder(backend=backend, factory=make_factory(backend), max_num_sequences=16)
    guide = GuidedDecodingParams(ebnf=COMMITTING_ITEM)
    assert decoder.closer.window(guide) > 100
    outputs = uniform_guided_generate(
        decoder, [guide] * 16, seed=0, max_tokens=90, checks=EngineChecks()
    )
    texts = [decoder.config.tokenizer.decode(out.token_ids) for out in outputs]
    assert all(out.finished and out.error is None for out in outputs), [t[-40:] for t in texts]
    assert all(re.fullmatch(r"x(y|z(0 ){100})*\.", text) for text in texts), texts
    assert decoder.closer.stats.resampled > 0  # z was drawn again


def test_a_guide_with_a_short_reach_keeps_the_default_window(tokenizer: TokenizerInfo) -> None:
    """Most guides reach their end within a few dozen tokens from anywhere: their outputs are
    searched and checked in the last ``WINDOW`` tokens only, as before."""
    closer = BudgetCloser(tokenizer, num_slots=1)
    assert closer.window(GuidedDecodingParams(json_schema=NAME_AGE)) == WINDOW
    assert closer.window(GuidedDecodingParams(choice=["yes", "no"])) == WINDOW
    assert closer.window(GuidedDecodingParams(ebnf='root ::= "a"')) == WINDOW
    long_regex = GuidedDecodingParams(regex="a|b{200}")
    assert closer.window(long_regex) > 200
    assert closer.window(GuidedDecodingParams(ebnf='root ::= "a" | "b" "c"{200}')) > 200
    assert closer.window(GuidedDecodingParams(lark='start: "a" | "b" "c"~200')) == WINDOW


def test_every_output_of_a_guide_starts_from_its_first_output_s_witness(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo
) -> None:
    """The initial state of a guide is every output's: the first output's start witness is
    checked first for the next ones (one ``completes``), even after the output has kept
    witnesses of many other states."""
    params = GuidedDecodingParams(json_schema=NAME_AGE)
    closer = BudgetCloser(tokenizer, num_slots=2)
    factory = make_factory("xgrammar")
    first = _CountingCompletes(factory.create(params))
    start = GuidedRequest.context(params, request_id=0, seq_slot=0, tokens_left=40)
    _closed_row(closer, first, start, tokenizer.vocab_size)
    assert closer.stats.searches == 1
    for text in ['{"name": "a', '{"name": "a", "age": 1', '{"name": "a", "age": ']:
        other = factory.create(params)
        assert all(other.accept_token(t) for t in tokenizer.encode(text))
        closer.witnesses.find(params, other, 40)
    assert closer.stats.searches == 4  # the kept witnesses: three others, newest first
    second = _CountingCompletes(factory.create(params))
    _CountingCompletes.calls = 0
    again = GuidedRequest.context(params, request_id=1, seq_slot=1, tokens_left=40)
    _closed_row(closer, second, again, tokenizer.vocab_size)
    assert closer.stats.searches == 4 and _CountingCompletes.calls == 1
    assert closer._slots[1].witness == closer._slots[0].witness


class _CountingMoves(_CountingCompletes):
    moves = 0

    def accept_token(self, token: int) -> bool:
        self.moves += 1
        return self.inner.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        self.moves += 1
        self.inner.rollback(num_tokens)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_token_that_keeps_the_witness_is_checked_in_one_completes(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo, backend: str
) -> None:
    """String content leaves the witness as it was: :meth:`BudgetCloser.admits` checks the token
    and the witness in one ``completes`` and keeps the witness (nothing else runs); a token
    after which it does not complete is checked as before, and what is found completes the new
    state. Either way the matcher is left as it was."""
    params = GuidedDecodingParams(json_schema=NAME_AGE)
    closer = BudgetCloser(tokenizer, num_slots=1)
    matcher = _CountingMoves(make_factory(backend).create(params))
    assert all(matcher.accept_token(t) for t in tokenizer.encode('{"name": "ab'))
    witness = closer.witnesses.find(params, matcher, 40)
    assert witness is not None
    closer._slots[0].witness = witness
    (content,) = tokenizer.encode("x")
    _CountingMoves.calls, searches, moves = 0, closer.stats.searches, matcher.moves
    assert closer.admits(0, matcher, params, content, 40)
    assert closer._slots[0].after == (content, witness) and _CountingMoves.calls == 1
    assert matcher.moves == moves  # no accept_token, no rollback of its own
    assert closer.stats.searches == searches and closer.stats.respelled == 0
    assert completes(matcher, witness)  # the matcher is where it was
    (quote,) = tokenizer.encode('"')
    assert quote != witness[0]
    assert closer.admits(0, matcher, params, quote, 40)
    after = closer._slots[0].after
    assert after is not None and after[0] == quote and after[1] != witness
    assert _CountingMoves.calls > 2  # the token with the witness, then the others
    assert completes(matcher, witness)
    assert matcher.accept_token(quote) and completes(matcher, after[1])


def test_a_respelled_rest_is_encoded_once(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rests a respelling encodes recur across the outputs of a guide: each text is
    encoded once, and the kept encoding completes the state as a fresh one does."""
    params = GuidedDecodingParams(json_schema=NAME_AGE)
    closer = BudgetCloser(tokenizer, num_slots=2)
    factory = make_factory("xgrammar")
    encoded: list[str] = []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text: encoded.append(text) or encode(text))
    (token,) = tokenizer.encode("na")
    for _ in range(2):  # two outputs at the same state
        matcher = factory.create(params)
        assert all(matcher.accept_token(t) for t in encode('{"na'))
        witness = [*encode('name": "", "age": 0}'), tokenizer.stop_token_ids[0]]
        found = closer.witnesses.respelled(matcher, witness, token, 40)  # ``na`` is accepted
        assert found is not None and completes(matcher, found)
    assert encoded == ["na", 'me": "", "age": 0}']  # the token's own encode, then the rest once


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("before", "written", "witness_text", "rest"),
    [
        # whitespace before the structural character the witness begins with
        ('{"name": ""', " ,", ', "age": 0}', ' "age": 0}'),
        # the model closes the string where the witness wrote content first
        ('{"name": "', '",', 'x", "age": 0}', ' "age": 0}'),
        # content, then the quote the witness begins with
        ('{"name": "', ')"', '", "age": 0}', ', "age": 0}'),
    ],
)
def test_the_witness_s_rest_after_what_the_token_wrote_is_found_without_a_search(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    backend: str,
    before: str,
    written: str,
    witness_text: str,
    rest: str,
) -> None:
    """A token that writes the witness's structural character after whitespace, or after
    content of its own, or that skips what the witness wrote before it: the witness's text
    from there on, encoded again, completes the new state."""
    params = GuidedDecodingParams(json_schema=NAME_AGE)
    closer = BudgetCloser(tokenizer, num_slots=1)
    matcher = make_factory(backend).create(params)
    (token,) = tokenizer.encode(written)
    assert all(matcher.accept_token(t) for t in [*tokenizer.encode(before), token])
    stop = tokenizer.stop_token_ids[0]
    witness = [*tokenizer.encode(witness_text), stop]
    found = closer.witnesses.respelled(matcher, witness, token, 40)
    assert found == [*tokenizer.encode(rest), stop]
    assert completes(matcher, found) and closer.stats.respelled == 1
    assert (
        closer.witnesses.respelled(matcher, witness, token, len(found) - 1) is None
    )  # over the limit


@given(written=st.text('ab ,"\n', max_size=4), text=st.text('ab,"}', max_size=8))
def test_each_rest_is_what_follows_the_token_s_text_in_the_witness_s(
    written: str, text: str
) -> None:
    """Each rest is ``text`` after an occurrence of ``written`` (whitespace stripped), or of
    its end at the start: what the output would still have to write had it followed the
    witness. The rest after ``written`` itself comes first."""
    rests = witness_rests(written, text)
    solid = written.strip()
    for rest in rests:
        assert text.endswith(rest)
        done = text[: len(text) - len(rest)]
        assert done == written or done.endswith(solid) or solid.endswith(done)
        assert solid or done == written
    if text.startswith(written):
        assert rests == [text[len(written) :]]
    elif solid and (solid in text or solid[-1] == text[:1]):
        assert rests


@pytest.mark.parametrize("backend", BACKENDS)
def test_think_first_free_text_leaves_its_value_room_of_its_own(
    make_factory: Callable[..., GrammarMatcherFactory], tokenizer: TokenizerInfo, backend: str
) -> None:
    """Inside a ``think_first`` output's free text a token is admitted only while the value's
    shortest completion plus ``THINK_ROOM`` still fits after it, so the model writes its value
    in its own style; the opener itself, and any token once the value is open, need no room."""
    params = GuidedDecodingParams(json_schema=NAME_AGE, think_first=True)
    matcher = make_factory(backend).create(params)
    assert all(matcher.accept_token(t) for t in tokenizer.encode("Let me think"))
    closer = BudgetCloser(tokenizer, num_slots=1)
    witness = closer.witnesses.find(params, matcher, 64)
    assert witness is not None and witness[0] == tokenizer.encode("{")[0]
    word, (opener,) = tokenizer.encode(" more")[0], tokenizer.encode("{")
    need = len(witness) + THINK_ROOM + 1  # the word, then room, then the witness
    assert closer.admits(0, matcher, params, word, need)
    closer.forget(0)
    assert not closer.admits(0, matcher, params, word, need - 1)
    closer.forget(0)
    assert closer.admits(0, matcher, params, opener, len(witness))
    closer.forget(0)
    assert all(matcher.accept_token(t) for t in tokenizer.encode('{"name": "a'))
    assert closer.admits(0, matcher, params, tokenizer.encode("b")[0], len(witness))
