"""Free text as llguidance terminals: Rust-regex literals, text avoiding given strings, and the
check that delimiters of free text cannot overlap (so cutting at the first one is exact)."""

from __future__ import annotations

from collections.abc import Sequence


def rx(text: str) -> str:
    """``text`` as a literal inside a Rust regex."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text)


def avoiding(strings: Sequence[str], *, nonempty: bool = False) -> str:
    """A Lark terminal expression: text (any characters) containing none of ``strings``."""
    text = "/(?s:.+)/" if nonempty else "/(?s:.*)/"
    if not strings:
        return text
    return f"{text} & ~/(?s:.*)(?:{'|'.join(rx(s) for s in strings)})(?s:.*)/"


def check_separable(delimiters: Sequence[str], excludes: Sequence[str], what: str) -> None:
    """Free text is cut at the first delimiter, which is xgrammar's reading only when no
    delimiter occurs inside another or overlaps one (a proper prefix equal to a suffix). An
    excluded string must not overlap a trigger either: xgrammar scans both in one pass."""
    for text in [*delimiters, *excludes]:
        if not text:
            raise ValueError(f"{what}: an empty string cannot delimit or be excluded from text")
    pairs = [(a, b) for a in delimiters for b in delimiters]
    pairs += [(a, b) for a in delimiters for b in excludes] + [
        (b, a) for a in delimiters for b in excludes
    ]
    for a, b in pairs:
        if a != b and a in b:
            raise ValueError(f"{what}: {a!r} occurs inside {b!r}, cannot convert exactly")
        if any(len(b) > k and b.endswith(a[:k]) for k in range(1, len(a))):
            raise ValueError(f"{what}: {b!r} overlaps {a!r}, cannot convert exactly")
