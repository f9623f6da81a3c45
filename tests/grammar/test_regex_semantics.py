"""A REGEX guide means on every backend what ``re.fullmatch(pattern, text, re.ASCII)`` means:
``.`` without ``"\\n"``, ASCII ``\\d \\w \\s``, Python's character classes and repetitions.
Constructs a backend would read otherwise are refused on it (see guidedec.grammar.convert.regex).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guidedec import GrammarMatcherFactory, GuidedDecodingParams, TokenizerInfo
from guidedec.errors import GrammarError
from guidedec.grammar.convert import regex_for_llguidance, regex_for_xgrammar
from guidedec.testing import accepts_output

BACKENDS = ("xgrammar", "llguidance")
NBSP, EM_SPACE, ARABIC_THREE = "\xa0", "\u2003", "\u0663"

CASES = [
    # "." is any character but "\n".
    (r"a.b", "a\nb"),
    (r"a.b", "a\rb"),
    (r"a.b", "aéb"),
    (r".+", "x\n"),
    # \d \w \s and their negations are ASCII.
    (r"\d", ARABIC_THREE),
    (r"\d", "7"),
    (r"\D", ARABIC_THREE),
    (r"\w", "é"),
    (r"\w", "_"),
    (r"\W", "é"),
    (r"\W", "-"),
    (r"\s", NBSP),
    (r"\s", EM_SPACE),
    (r"\s", "\x0b"),
    (r"\s", "\x0c"),
    (r"\S", NBSP),
    (r"\S", "\x1c"),
    (r"\S", " "),
    # ... also inside classes, negated or not.
    (r"[\d]", ARABIC_THREE),
    (r"[^\d]", ARABIC_THREE),
    (r"[^\d]", "5"),
    (r"[\w.]", "é"),
    (r"[\w.]", "."),
    (r"[^\s]", NBSP),
    (r"[\S]", "\n"),
    (r"[\W\d]", "5"),
    (r"[^\D]", ARABIC_THREE),
    (r"[a\s]", EM_SPACE),
    # Dots that are not the wildcard, and an escaped backslash before one that is.
    (r"\.", "x"),
    (r"\.", "."),
    (r"[.]", "\n"),
    (r"[.]", "x"),
    (r"\\.", "\\\n"),
    (r"\\.", "\\x"),
    (r"\\\.", "\\."),
    (r"\\\.", "\\x"),
    # Class syntax read as Python reads it.
    (r"[]a]", "]"),
    (r"[^]a]", "b"),
    (r"[^]a]", "]"),
    (r"[[:alpha:]]", "a"),
    (r"[[:alpha:]]", "a]"),
    (r"[a&&b]", "&"),
    (r"[a~~b]", "~"),
    (r"[a-c--e]", "d"),
    (r"[a-c--e]", "-"),
    (r"[-a]", "-"),
    (r"[a-]", "-"),
    (r"[\b]", "\b"),
    (r"[\1]", "\x01"),
    # Repetitions, literal braces and escapes.
    (r"a{,2}", ""),
    (r"a{,2}", "aaa"),
    (r"a{x}", "a{x}"),
    (r"a{ 2}", "aa"),
    (r"a{ 2}", "a{ 2}"),
    (r"\012", "\n"),
    (r"\N{DIGIT ONE}", "1"),
    (r"\<a\>", "<a>"),
    # Anchors where nothing can come before / after them.
    (r"^$|^a", ""),
    (r"(a|^b)$", "b"),
    (r"^(a$|b)", "a"),
]

# Refused on every backend: a backend would otherwise read them differently from Python.
REFUSED = [r"a^b", r"a$b", r"(^a)+", r"x(a|^b)", r"a*+", r"(?x)a b", r"[\d-z]", r"\U41"]
# Refused on xgrammar, which would read the escape as the bare letter.
REFUSED_BY_XGRAMMAR = [r"\Aa", r"a\Z", r"a\z", r"[\p{L}]", r"[\B]"]


def accepts(
    factory: GrammarMatcherFactory, tokenizer: TokenizerInfo, pattern: str, text: str
) -> bool:
    return accepts_output(factory, tokenizer, GuidedDecodingParams(regex=pattern), text)


def python_verdict(pattern: str, text: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "possible nested set / set difference"
        return re.fullmatch(pattern, text, re.ASCII) is not None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("pattern", "text"), CASES)
def test_regex_guide_accepts_exactly_what_python_re_ascii_matches(
    backend: str,
    pattern: str,
    text: str,
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
) -> None:
    expected = python_verdict(pattern, text)
    assert accepts(make_factory(backend), tokenizer, pattern, text) is expected


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", REFUSED)
def test_pattern_a_backend_would_misread_is_refused_everywhere(
    backend: str, pattern: str, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    with pytest.raises(GrammarError):
        make_factory(backend).create(GuidedDecodingParams(regex=pattern))


@pytest.mark.parametrize("pattern", REFUSED_BY_XGRAMMAR)
def test_escape_xgrammar_reads_as_a_letter_is_refused_on_xgrammar(
    pattern: str, make_factory: Callable[..., GrammarMatcherFactory]
) -> None:
    with pytest.raises(GrammarError, match="not supported"):
        make_factory("xgrammar").create(GuidedDecodingParams(regex=pattern))


@pytest.mark.parametrize(
    ("pattern", "xgrammar", "llguidance"),
    [
        (r"a.b", r"a[^\n]b", r"a.b"),
        (r"\.[.]\\.", r"\.[.]\\[^\n]", r"\.[.]\\."),
        (r"\d\W", r"[0-9][^0-9A-Z_a-z]", r"[0-9][^0-9A-Z_a-z]"),
        (r"[\d\s-]", r"[0-9\x09-\x0d\x20-]", r"[0-9\x09-\x0d\x20\-]"),
        (r"[^\D]", r"[^\x00-\x2f\x3a-\U0010ffff]", r"[^\x00-\x2f\x3a-\U0010ffff]"),
        (r"[]&&[]", r"[\]&&[]", r"[\]\&\&\[]"),
        (r"a{,3}{", r"a{0,3}\{", r"a{0,3}\{"),
        (r"\x{e9}\0", r"\u{e9}\x00", r"\x{e9}\x00"),
    ],
)
def test_rewriters_change_only_what_the_backend_reads_otherwise(
    pattern: str, xgrammar: str, llguidance: str
) -> None:
    assert regex_for_xgrammar(pattern) == xgrammar
    assert regex_for_llguidance(pattern) == llguidance


# Hypothesis: small patterns over the classes that differed, with texts built to match often.
ATOMS = [".", r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", "a", "é", r"\.", r"[.]", r"[\d.]"]
ATOMS += [r"[^\s]", r"[\w-]", r"[^\W\d]", r"\n", "(a|5)", r"(\s|\.)"]
QUANTIFIERS = ["", "", "?", "*", "+", "{0,2}"]
CHARS = ["a", "5", "_", " ", ".", "-", "\n", "\t", "é", NBSP, EM_SPACE, ARABIC_THREE]


@st.composite
def patterns_and_texts(draw: st.DrawFn) -> tuple[str, str]:
    """A pattern of 1-3 quantified atoms and a text of 0-2 characters per atom."""
    pieces = draw(
        st.lists(
            st.tuples(
                st.sampled_from(ATOMS),
                st.sampled_from(QUANTIFIERS),
                st.lists(st.sampled_from(CHARS), max_size=2),
            ),
            min_size=1,
            max_size=3,
        )
    )
    pattern = "".join(atom + quantifier for atom, quantifier, _ in pieces)
    text = "".join("".join(chars) for _, _, chars in pieces)
    return pattern, text


@settings(max_examples=60, deadline=None)
@given(case=patterns_and_texts())
def test_both_backends_agree_with_python_on_generated_patterns(
    case: tuple[str, str],
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
) -> None:
    pattern, text = case
    expected = python_verdict(pattern, text)
    for backend in BACKENDS:
        verdict = accepts(make_factory(backend), tokenizer, pattern, text)
        assert verdict is expected, f"{backend}: {pattern!r} on {text!r}"


def stop_text_completes_match(tokenizer: TokenizerInfo, pattern: str, text: str) -> bool:
    stop_text = tokenizer.decode([tokenizer.eos_token_id])
    return python_verdict(pattern, text + stop_text) and not python_verdict(pattern, text)


@pytest.mark.parametrize(("pattern", "text"), [(r".+", ""), (r"a\S+", "a"), (r".{19}", "")])
def test_xgrammar_refuses_stop_token_whose_text_would_complete_the_match(
    pattern: str,
    text: str,
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
) -> None:
    # xgrammar 0.2.9 reads a token as its text unless the vocabulary gives it none: guidedec
    # blanks the special tokens, so '<｜end▁of▁sentence｜>' can no longer complete '.+'.
    assert stop_text_completes_match(tokenizer, pattern, text)
    assert not accepts(make_factory("xgrammar"), tokenizer, pattern, text)
