"""What the vLLM plugin reads and checks before vLLM queues a request (no vLLM needed)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import GuidedDecodingParams, TokenizerInfo
from guidedec.errors import GuidedecError
from guidedec.integrations.vllm_options import check_syntax, syntax_factory

GUIDES: list[dict[str, Any]] = [
    {"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    {"json_schema": {"type": "string", "pattern": "^a{1000000}$"}},  # compiles; fails at lexing
    {"json_schema": {"type": "array", "items": {"enum": ["x", 1, None]}, "minItems": 2}},
    {"regex": "(yes|no)-[0-9]{2}"},
    {"regex": "(unclosed"},
    {"choice": ["north", "south west"]},
    {"ebnf": 'root ::= "(" [a-c] [a-c]? ")"'},
    {"ebnf": 'root ::= "a" undefined'},
    {"lark": 'start: "<" /[0-9]{1,3}/ ">"'},
    {"lark": "start: foo"},
    {"lark": 'start: "a" <[128000]>'},  # a token id only a real vocabulary has
    {"lark": 'start: "a" <[999999]>'},  # one that none has
]


def _compiles(factory: Any, guide: GuidedDecodingParams) -> bool:
    try:
        factory.compile(guide)
    except (GuidedecError, ValueError):
        return False
    return True


@pytest.mark.parametrize("fields", GUIDES, ids=lambda f: str(f)[:48])
def test_a_guide_is_refused_exactly_where_the_bundled_tokenizer_refuses_it(
    fields: dict[str, Any],
) -> None:
    """The byte-level check first, the bundled tokenizer where it fails: the verdicts of a
    check on the bundled tokenizer alone, a guide that names a token id only a real vocabulary
    has included."""
    guide = GuidedDecodingParams(**fields)
    expected = _compiles(syntax_factory(bytes_only=False), guide)
    try:
        check_syntax(guide)
    except (GuidedecError, ValueError):
        assert not expected, fields
    else:
        assert expected, fields


def test_the_byte_level_check_alone_would_refuse_a_real_vocabularys_token() -> None:
    guide = GuidedDecodingParams(lark='start: "a" <[128000]>')
    assert not _compiles(syntax_factory(bytes_only=True), guide)
    check_syntax(guide)  # accepted: the bundled tokenizer has that token


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40))
def test_the_byte_level_tokenizer_spells_any_text(text: str) -> None:
    tokenizer = TokenizerInfo.byte_level()
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert tokenizer.vocab_size == 257 and tokenizer.stop_token_ids == (256,)
