"""Reading the fields of a structural-tag format (JSON), with errors naming the format, and
the token references they become in Lark."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def format_field(
    fmt: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    """``fmt[key]``, of type ``kind`` (a bool is no int); ``default`` where absent, if given."""
    value = fmt.get(key, default)
    if value is ...:
        raise ValueError(f"structural tag format {fmt.get('type')!r} is missing {key!r}")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValueError(f"structural tag format {fmt.get('type')!r}: {key!r} has the wrong type")
    return value


def token_ref(token: Any) -> str:
    """A token id, or a special token's text like ``<|x|>``, as a Lark token reference."""
    if isinstance(token, int) and not isinstance(token, bool) and token >= 0:
        return f"<[{token}]>"
    if isinstance(token, str) and re.fullmatch(r"<[^<>\s]+>", token):
        return token  # llguidance resolves a special token by its text
    raise ValueError(f"token {token!r} is neither a token id nor a special token like <|x|>")


def token_set(fmt: Mapping[str, Any], key: str, *, negated: bool) -> str:
    """The token ids ``fmt[key]`` (absent: none) as one Lark token set (``negated``: all others)."""
    ids = fmt.get(key, [])
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise ValueError(f"{fmt.get('type')} {key!r} must be a list of token ids")
    if not ids:
        return "<[*]>" if negated else "<[^*]>"
    return f"<[{'^' if negated else ''}{','.join(str(i) for i in sorted(set(ids)))}]>"


def token_ids(fmt: Mapping[str, Any], key: str) -> list[int]:
    """``fmt[key]`` as token ids (absent: none)."""
    ids = fmt.get(key, [])
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise ValueError(f"{fmt.get('type')} {key!r} must be token ids (token strings unsupported)")
    return ids


def strings(fmt: Mapping[str, Any], key: str) -> list[str]:
    """``fmt[key]`` as strings (absent: none)."""
    value = fmt.get(key, [])
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ValueError(f"structural tag format {fmt.get('type')!r}: {key!r} must be strings")
    return value


def nonempty_list(fmt: Mapping[str, Any], key: str) -> list[Any]:
    """``fmt[key]``, which must be a non-empty list."""
    value = fmt.get(key)
    if not isinstance(value, list) or not value:
        raise ValueError(f"structural tag format {fmt.get('type')!r} needs a non-empty {key!r}")
    return value


def xgrammar_ebnf(reader: str, text: str) -> str:
    """xgrammar's own reading of a regex or Lark grammar, printed as EBNF."""
    import xgrammar

    try:
        return str(getattr(xgrammar.Grammar, reader)(text))
    except Exception as exc:  # xgrammar raises RuntimeError and friends
        raise ValueError(f"xgrammar cannot read {text!r:.80}: {exc}") from exc
