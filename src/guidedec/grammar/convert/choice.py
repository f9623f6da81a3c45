"""CHOICE guides (one string out of a list) as xgrammar EBNF and as llguidance Lark."""

from __future__ import annotations

from collections.abc import Sequence

from guidedec.grammar.convert.ebnf_writers import lark_literal, xgrammar_literal


def _checked_choices(choices: Sequence[str]) -> list[str]:
    if isinstance(choices, str):
        raise ValueError("choice list must be a sequence of strings, not a single string")
    items = list(choices)
    if not items:
        raise ValueError("choice list is empty: a CHOICE guide needs at least one string")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ValueError(f"choice {i} is a {type(item).__name__}, not a string")
        if any(0xD800 <= ord(c) <= 0xDFFF for c in item):
            raise ValueError(f"choice {i} contains a lone surrogate, which is not a character")
    return items


def choice_to_ebnf(choices: Sequence[str]) -> str:
    """xgrammar EBNF (root rule ``root``) matching exactly one of ``choices``.

    Any string content works (quotes, backslashes, control characters, non-ASCII, ``""``);
    duplicates are allowed.

    Raises:
        ValueError: the list is empty or holds something other than strings.
    """
    items = _checked_choices(choices)
    return "root ::= " + " | ".join(xgrammar_literal(item) for item in items) + "\n"


def choice_to_lark(choices: Sequence[str]) -> str:
    """llguidance Lark (entry rule ``start``) matching exactly one of ``choices``.

    Each choice is one lexeme; nothing follows it, so greedy lexing cannot split a choice.

    Raises:
        ValueError: the list is empty or holds something other than strings.
    """
    items = _checked_choices(choices)
    return "start: " + " | ".join(lark_literal(item) for item in dict.fromkeys(items)) + "\n"
