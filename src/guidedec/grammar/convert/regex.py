"""REGEX guides with one meaning on every backend: that of ``re.fullmatch(pattern, text,
re.ASCII)``.

Each rewriter changes only what its backend (xgrammar 0.2.9, llguidance 1.9.1) reads otherwise:

- ``.`` is any character but ``"\\n"`` (xgrammar took ``"\\n"`` too).
- ``\\d``, ``\\w``, ``\\s`` are the ASCII classes of JSON Schema (ECMA-262) and ``re.ASCII``:
  ``[0-9]``, ``[0-9A-Z_a-z]``, ``[\\t\\n\\v\\f\\r ]``; ``\\D``, ``\\W``, ``\\S`` their complements,
  also inside ``[...]``. llguidance (Rust ``regex``) read all six by Unicode, xgrammar its
  ``\\s``/``\\S`` (no-break space, U+2000-U+200A, ...).
- In ``[...]``, ``[``, ``&&``, ``--``, ``~~`` and a ``]`` right after ``[`` or ``[^`` are
  characters. llguidance read nested classes (``[[:alpha:]]``) and set operations; xgrammar
  refused ``[]a]`` and misread ``[^]a]``.
- ``{,n}`` is ``{0,n}``; a ``{`` that starts no ``{m,n}`` is a character; octal escapes
  (``\\0``, ``\\012``, ``[\\1]``), ``\\N{name}`` and ``[\\b]`` (backspace) are characters. Each
  backend refused some of these; xgrammar read ``[\\1]`` as ``1``, llguidance ``a{ 2}`` as ``aa``.
- ``^`` and ``$`` stand only where nothing can come before, resp. after them; elsewhere
  (``a^b``, ``(a$)+``) the guide is refused. xgrammar ignored them.

Refused everywhere (``ValueError``, which the backend reports as a ``GrammarError``) because a
backend would read them otherwise: possessive quantifiers (``a*+``), the verbose flag ``(?x)``
(Rust skips whitespace inside classes, Python does not), a class escape bounding a range
(``[\\d-z]``) and ``\\x``/``\\u``/``\\U`` with too few digits. Refused on xgrammar, which reads
them as the bare letter: ``\\A``, ``\\Z``, ``\\z``, ``[\\B]``, ``[\\p{L}]`` and other unknown
escapes. What a backend does not support at all is left to it to refuse: ``\\b``, lookarounds,
backreferences, inline flags on xgrammar. Rust's ``\\x{...}``/``\\u{...}`` code points, unknown to
Python, work on both, its ``\\p{...}`` classes on llguidance only. One difference remains: under
``(?i)`` llguidance folds case by Unicode rules (``k`` also matches U+212A KELVIN SIGN),
``re.ASCII`` by ASCII ones.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

from guidedec.grammar.convert.ebnf_ast import MAX_CODEPOINT
from guidedec.grammar.convert.regex_syntax import (
    OCTAL,
    ClassItem,
    Token,
    is_class_escape,
    read_pattern,
)

# The ASCII classes, as inclusive code point ranges.
_ASCII_CLASSES = {
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": ((0x09, 0x0D), (0x20, 0x20)),
}
# Escapes of a letter or digit that xgrammar 0.2.9 reads as Python does or refuses itself; it
# reads every other one as the bare character (with a warning that the backend silences).
_XGRAMMAR_ESCAPES = frozenset("abBcefknpPrtvxuU123456789")
_XGRAMMAR_CLASS_ESCAPES = frozenset("acefnrtvxuU")


def regex_for_xgrammar(pattern: str) -> str:
    """``pattern`` rewritten so that xgrammar's ``compile_regex`` reads it as this module says.

    Raises:
        ValueError: the pattern is malformed, or xgrammar would misread a construct in it.
    """
    tokens = read_pattern(pattern)
    return "".join(_text(token, _xgrammar_atom, dot="[^\\n]") for token in tokens)


def regex_for_llguidance(pattern: str) -> str:
    """``pattern`` rewritten so that llguidance (Rust ``regex`` syntax) reads it as this module
    says.

    Raises:
        ValueError: the pattern is malformed or uses a construct refused on every backend.
    """
    tokens = read_pattern(pattern)
    return "".join(_text(token, _llguidance_atom, dot=".") for token in tokens)


# --- Writing it for a backend --------------------------------------------------------------------

_AtomWriter = Callable[[str, bool], str]  # (atom, inside a class) -> its text for a backend


def _text(token: Token, write_atom: _AtomWriter, *, dot: str) -> str:
    if token.kind == "dot":
        return dot
    if token.kind == "escape":
        if is_class_escape(token.text):
            letter = token.text[1]
            negation = "^" if letter.isupper() else ""
            return f"[{negation}{_class_ranges(letter.lower())}]"
        return write_atom(_plain_escape(token.text, False), False)
    if token.kind == "class":
        body = "".join(_item_text(item, write_atom) for item in token.items)
        return f"[{'^' if token.negated else ''}{body}]"
    return token.text


def _item_text(item: ClassItem, write_atom: _AtomWriter) -> str:
    if is_class_escape(item.low):
        return _class_ranges(item.low[1])
    low = _class_atom(item.low, write_atom)
    return low if item.high is None else f"{low}-{_class_atom(item.high, write_atom)}"


def _class_atom(atom: str, write_atom: _AtomWriter) -> str:
    if atom == "]":
        return "\\]"
    if atom == "\\b":  # backspace
        return "\\x08"
    return write_atom(_plain_escape(atom, True), True)


def _xgrammar_atom(atom: str, in_class: bool) -> str:
    if not atom.startswith("\\"):
        return atom
    kind = atom[1]
    if kind in "xU" and atom.startswith("{", 2):
        return "\\u" + atom[2:]
    known = _XGRAMMAR_CLASS_ESCAPES if in_class else _XGRAMMAR_ESCAPES
    if kind.isascii() and kind.isalnum() and kind not in known:
        raise ValueError(f"the escape {atom} is not supported (xgrammar would read it as {kind})")
    return atom


def _llguidance_atom(atom: str, in_class: bool) -> str:
    if atom in ("\\<", "\\>"):  # Rust: word boundaries; Python: the character
        return atom[1]
    if in_class and atom in ("[", "&", "~", "-"):  # Rust: nested classes and set operations
        return "\\" + atom
    return atom


def _class_ranges(letter: str) -> str:
    """The ranges of ``\\<letter>`` as the inside of a ``[...]``."""
    ranges = _ASCII_CLASSES[letter.lower()]
    if letter.isupper():
        ranges = _complement(ranges)
    return "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    result, start = [], 0
    for lo, hi in ranges:  # sorted and disjoint
        if lo > start:
            result.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODEPOINT:
        result.append((start, MAX_CODEPOINT))
    return tuple(result)


def _char(codepoint: int) -> str:
    """A code point as a class member: itself if a letter, digit or ``_``, else an escape."""
    char = chr(codepoint)
    if char.isascii() and (char.isalnum() or char == "_"):
        return char
    if codepoint < 0x100:
        return f"\\x{codepoint:02x}"
    return f"\\u{codepoint:04x}" if codepoint < 0x10000 else f"\\U{codepoint:08x}"


def _plain_escape(atom: str, in_class: bool) -> str:
    """``atom`` with a Python-only character escape (octal ``\\012``, ``\\0``, in a class also
    ``\\1``; named ``\\N{...}``) written as a hex escape, which every backend reads."""
    if atom.startswith("\\N{"):
        try:
            char = unicodedata.lookup(atom[3:-1])
        except KeyError:
            raise ValueError(f"unknown character name in {atom}") from None
        if len(char) != 1:
            raise ValueError(f"{atom} names a sequence of characters, not one")
        return _char(ord(char))
    if len(atom) < 2 or atom[0] != "\\" or not all(d in OCTAL for d in atom[1:]):
        return atom
    if not in_class and atom[1] != "0" and len(atom) < 4:  # \1, \12: a group number
        return atom
    value = int(atom[1:], 8)
    if value > 0o377:
        raise ValueError(f"octal escape {atom} is out of range")
    return _char(value)
