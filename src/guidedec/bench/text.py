"""Docstrings as terminal text: ``--help`` shows ``name`` as name, not as reStructuredText."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`x`, :func:`~x`
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str) -> str:
    """``text`` with its reST roles and inline literals as their plain content."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))
