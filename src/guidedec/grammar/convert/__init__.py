"""Dialect conversion between guide types, so that one guide means the same on every backend.

Pure functions on text. Each raises ``ValueError`` naming the problem when its input is malformed
or uses a construct that cannot be carried over with the same meaning.

EBNF is read as xgrammar 0.2.9 reads it (the reference for the EBNF guide type), plus three GBNF
(llama.cpp) forms that xgrammar refuses and whose meaning is unambiguous: empty alternatives
(``ws ::= | " "``), ``.`` for any character (an undefined name made only of dots) and ``{,n}``.
:func:`normalize_ebnf` rewrites those for xgrammar; :func:`ebnf_to_lark` writes llguidance Lark.

llguidance lexes *greedily*: a lexeme ends only where no allowed lexeme can be extended, so
``num num`` with ``NUM: /[0-9]+/`` rejects ``"12"``, which a character-level CFG (xgrammar,
llama.cpp) accepts. The Lark written here therefore uses one-character lexemes for everything
that came from EBNF (the Earley parser then sees the character-level grammar exactly), and
multi-character lexemes only where greedy lexing provably cannot change the language: a whole
choice list, free text that runs to the end of the grammar, and free text bounded by delimiters
that cannot overlap (see :func:`structural_tag_to_lark`).

Modules: ``ebnf_ast`` (syntax tree), ``ebnf_lexer`` and ``ebnf_parser`` (reading EBNF),
``ebnf_writers`` (xgrammar EBNF and Lark out), ``choice`` (CHOICE guides), ``regex`` (REGEX
guides, read as Python's ``re`` with ``re.ASCII`` on both backends), ``structural_tag``
(entry points for structural tags), written by the layers ``tag_writer`` (basic formats),
``tag_combinators`` and ``tag_dispatch``, with the helpers ``tag_tail``, ``tag_fields``,
``tag_free_text``, ``tag_json`` and ``tag_analysis``.
"""

from __future__ import annotations

from guidedec.grammar.convert.choice import choice_to_ebnf, choice_to_lark
from guidedec.grammar.convert.ebnf_ast import ANY_CHAR as ANY_CHAR
from guidedec.grammar.convert.ebnf_ast import MAX_CODEPOINT as MAX_CODEPOINT
from guidedec.grammar.convert.ebnf_ast import Alt as Alt
from guidedec.grammar.convert.ebnf_ast import CharClass as CharClass
from guidedec.grammar.convert.ebnf_ast import Grammar as Grammar
from guidedec.grammar.convert.ebnf_ast import Lit as Lit
from guidedec.grammar.convert.ebnf_ast import Node as Node
from guidedec.grammar.convert.ebnf_ast import Ref as Ref
from guidedec.grammar.convert.ebnf_ast import Repeat as Repeat
from guidedec.grammar.convert.ebnf_ast import Seq as Seq
from guidedec.grammar.convert.ebnf_parser import parse_ebnf as parse_ebnf
from guidedec.grammar.convert.ebnf_writers import LarkWriter as LarkWriter
from guidedec.grammar.convert.ebnf_writers import ebnf_to_lark, normalize_ebnf
from guidedec.grammar.convert.ebnf_writers import lark_literal as lark_literal
from guidedec.grammar.convert.ebnf_writers import xgrammar_literal as xgrammar_literal
from guidedec.grammar.convert.regex import regex_for_llguidance, regex_for_xgrammar
from guidedec.grammar.convert.structural_tag import (
    structural_tag_to_lark,
    structural_tag_to_xgrammar_arg,
)

# The guide converters; the EBNF tree, parser and writers above are re-exported for tools and
# tests, as the single module this package replaces exposed them.
__all__ = [
    "choice_to_ebnf",
    "choice_to_lark",
    "ebnf_to_lark",
    "normalize_ebnf",
    "regex_for_llguidance",
    "regex_for_xgrammar",
    "structural_tag_to_lark",
    "structural_tag_to_xgrammar_arg",
]
