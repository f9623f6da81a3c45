"""A guide's own words: the keys, literals and values its outputs spell, read from the guide.

A search for a short completion of a grammar state (budget-aware closing,
:mod:`guidedec.decoder.closing.search`) tries them before other tokens: where the grammar asks for
a key or a keyword, the tokens that spell it are among them, and an open object would otherwise
take any key.
"""

from __future__ import annotations

import json
import re
from typing import Any

from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.tokenizer import TokenizerInfo

_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_LITERAL_RUN = re.compile(r"[A-Za-z0-9_]{2,}")
MAX_WORDS = 256
MAX_REST = 32
"""Literals of a grammar up to this long have their rests (each suffix) among its words."""
FORMAT_EXAMPLES = {
    "date-time": "2000-01-01T00:00:00Z",
    "date": "2000-01-01",
    "time": "00:00:00Z",
    "email": "a@b.co",
    "uri": "http://a.co",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "ipv4": "0.0.0.0",
}
"""A short instance of each common string ``format``: its tokens spell the format's value in a
few tokens instead of one character at a time."""


def guide_words(params: GuidedDecodingParams, tokenizer: TokenizerInfo) -> list[int]:
    """The tokens of a guide's own words, in the order the texts come: a JSON schema's property
    names (required ones first), string ``enum`` / ``const`` values (the shortest of each
    ``enum`` first: a completion that must write one of them writes that one) and an example of
    each ``format`` (``FORMAT_EXAMPLES``); a choice's options, the shortest first; the quoted
    literals of an EBNF or Lark grammar; the literal runs of a regex. A completion that must
    spell a key or a keyword finds it among them (an open object would otherwise take any
    key)."""
    texts = _guide_texts(params)
    ids: dict[int, int] = {}
    for text in texts[:MAX_WORDS]:
        for token in tokenizer.encode(text):
            ids.setdefault(token, len(ids))
    return list(ids)


def _guide_texts(params: GuidedDecodingParams) -> list[str]:
    kind, guide = params.guide_type, params.guide
    if kind is GuideType.JSON_SCHEMA:
        schema = json.loads(guide) if isinstance(guide, str) else guide
        required: list[str] = []
        other: list[str] = []
        _schema_words(schema, required, other, depth=0)
        return list(dict.fromkeys(required + other))
    if kind is GuideType.CHOICE:
        return sorted((str(option) for option in guide), key=len)  # type: ignore[union-attr]
    if kind in (GuideType.EBNF, GuideType.LARK):
        literals = [m.group(1) for m in _QUOTED.finditer(str(guide)) if m.group(1)]
        # then their rests: from inside a literal, the rest may split into other tokens
        rests = [t[i:] for t in literals if len(t) <= MAX_REST for i in range(1, len(t))]
        return list(dict.fromkeys(literals + rests))
    if kind is GuideType.REGEX:
        return _LITERAL_RUN.findall(str(guide))
    if kind is GuideType.STRUCTURAL_TAG:
        tag = json.loads(guide) if isinstance(guide, str) else guide
        fixed: list[str] = []
        names: list[str] = []
        words: list[str] = []
        _tag_words(tag, fixed, names, words, depth=0)
        ends = [t[i:] for t in fixed if len(t) <= MAX_REST for i in range(1, len(t))]
        return list(dict.fromkeys(fixed + names + words + ends))
    return []


_TAG_TEXTS = ("begin", "end", "value", "separator")


def _tag_words(
    node: Any, literals: list[str], required: list[str], other: list[str], depth: int
) -> None:
    """A structural tag's fixed texts (tags' begins and ends, constant strings, separators),
    and the words of its JSON schemas and grammars."""
    if depth > 32:
        return
    if isinstance(node, list):
        for item in node:
            _tag_words(item, literals, required, other, depth + 1)
        return
    if not isinstance(node, dict):
        return
    literals.extend(node[k] for k in _TAG_TEXTS if isinstance(node.get(k), str) and node[k])
    for key in ("json_schema", "schema"):
        if isinstance(node.get(key), dict):
            _schema_words(node[key], required, other, depth=0)
    if node.get("type") == "grammar" and isinstance(node.get("grammar"), str):
        other.extend(m.group(1) for m in _QUOTED.finditer(node["grammar"]) if m.group(1))
    for key, value in node.items():
        if key not in ("json_schema", "schema") and isinstance(value, dict | list):
            _tag_words(value, literals, required, other, depth + 1)


def _schema_words(node: Any, required: list[str], other: list[str], depth: int) -> None:
    if depth > 32:
        return
    if isinstance(node, dict):
        for name in node.get("required", []) if isinstance(node.get("required"), list) else []:
            if isinstance(name, str):
                required.append(name)
        properties = node.get("properties")
        if isinstance(properties, dict):
            other.extend(name for name in properties if isinstance(name, str))
        for key in ("enum", "const"):
            values = node.get(key)
            values = values if isinstance(values, list) else [values]
            other.extend(sorted((v for v in values if isinstance(v, str)), key=len))
        fmt = node.get("format")  # a dict where "format" names a property
        if isinstance(fmt, str) and fmt in FORMAT_EXAMPLES:
            other.append(FORMAT_EXAMPLES[fmt])
        for value in node.values():
            _schema_words(value, required, other, depth + 1)
    elif isinstance(node, list):
        for item in node:
            _schema_words(item, required, other, depth + 1)
