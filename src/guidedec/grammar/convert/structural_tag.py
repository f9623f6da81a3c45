"""Structural tags (xgrammar 0.2.9): either form (current or legacy) read as one format, passed
on to xgrammar as JSON, or converted to llguidance Lark with the same language."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from guidedec.grammar.convert.tag_dispatch import DispatchWriter
from guidedec.grammar.convert.tag_tail import EOF


def _current_format(tag: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """The format of a structural tag in either form (legacy ``structures``/``triggers`` too)."""
    if isinstance(tag, str):
        try:
            tag = json.loads(tag)
        except json.JSONDecodeError as exc:
            raise ValueError(f"structural tag is not valid JSON: {exc}") from exc
    if not isinstance(tag, Mapping):
        raise ValueError("structural tag must be a JSON object")
    if "structures" in tag:
        return _legacy_format(tag)
    if tag.get("type", "structural_tag") != "structural_tag" or "format" not in tag:
        raise ValueError(
            'structural tag must be {"type": "structural_tag", "format": {...}} '
            'or the legacy {"structures": [...], "triggers": [...]}'
        )
    return tag["format"]  # type: ignore[no-any-return]


def _legacy_format(tag: Mapping[str, Any]) -> dict[str, Any]:
    """xgrammar's StructuralTag.from_legacy_structural_tag, as plain JSON."""
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise ValueError("legacy structural tag needs 'structures' and 'triggers' lists")
    tags = [_legacy_tag(item) for item in structures]
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags}


def _legacy_tag(item: Any) -> dict[str, Any]:
    """One legacy structure as a tag format, with the field types xgrammar's StructuralTagItem
    requires: string ``begin`` and ``end``, and a ``schema`` object or its JSON text."""
    if not isinstance(item, Mapping) or not {"begin", "schema", "end"} <= item.keys():
        raise ValueError("each legacy structure needs 'begin', 'schema' and 'end'")
    if not isinstance(item["begin"], str) or not isinstance(item["end"], str):
        raise ValueError("legacy structure 'begin' and 'end' must be strings")
    schema = item["schema"]
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"legacy structure schema is not valid JSON: {exc}") from exc
    elif not isinstance(schema, Mapping):
        raise ValueError("legacy structure 'schema' must be a JSON schema object or its JSON text")
    content = {"type": "json_schema", "json_schema": schema}
    return {"type": "tag", "begin": item["begin"], "content": content, "end": item["end"]}


def structural_tag_to_xgrammar_arg(tag: Mapping[str, Any] | str) -> str:
    """The structural tag as the JSON text ``GrammarCompiler.compile_structural_tag`` takes,
    with the legacy form rewritten as xgrammar itself would (one triggered_tags format)."""
    return json.dumps({"type": "structural_tag", "format": _current_format(tag)})


def structural_tag_to_lark(tag: Mapping[str, Any] | str) -> str:
    """Convert an xgrammar 0.2.9 structural tag to llguidance Lark with the same language.

    Accepts ``{"type": "structural_tag", "format": {...}}`` (as a dict or JSON text) and the
    legacy ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``.

    Supported format types: const_string, json_schema (style ``json``, via ``%json`` with
    xgrammar's strict reading of objects and tuples), grammar (EBNF; Lark is first read by
    xgrammar, which reads it character by character), regex (read by xgrammar), sequence, or,
    tag, any_text, triggered_tags, tags_with_separator, optional, star, plus, repeat, dispatch,
    token, exclude_token, any_tokens, token_triggered_tags and token_dispatch (token ids, or
    special tokens named like ``<|x|>``). The builtin model tags of xgrammar convert where
    they use only these (those with XML-style JSON do not).

    Free text (any_text, and the text around triggered_tags and dispatch) is one llguidance
    lexeme, so it must (a) end the grammar or run up to a tag's end strings, where it stops at
    the first one, and (b) start where no other parse is alive: at the start, or after fixed
    text that tells its alternative apart. A JSON value that may be a bare number must not be
    followed by text that could continue the number. Within these rules the language is
    xgrammar's; outside them the conversion refuses rather than guess.

    Not converted (the text the model sees differs): a special token whose text appears in a
    literal matches that literal on xgrammar but not on llguidance, which never lets a special
    token stand for text. That is a difference of the backends' tokenizers, not of this text.

    Raises:
        ValueError: the tag is malformed, or needs what has no equivalent: format type
            qwen_xml_parameter; json_schema styles other than ``json``, ``any_order`` and
            ``excludes``; ``max_tokens`` budgets; free text or numbers placed against the
            rules above; delimiters that overlap.
    """
    writer = DispatchWriter()
    body = writer.emit(_current_format(tag), EOF)
    writer.out.lines.insert(0, f"start: {body}")
    return writer.out.text()
