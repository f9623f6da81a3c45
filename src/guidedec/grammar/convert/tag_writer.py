"""The first layer of the structural-tag writer: the machinery every format uses (dispatch by
format type, what follows, free text) and the basic formats, which contain no other format."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from guidedec.grammar.convert.ebnf_parser import parse_ebnf
from guidedec.grammar.convert.ebnf_writers import LarkWriter, lark_chars
from guidedec.grammar.convert.tag_fields import (
    format_field,
    strings,
    token_ref,
    token_set,
    xgrammar_ebnf,
)
from guidedec.grammar.convert.tag_free_text import avoiding, check_separable, rx
from guidedec.grammar.convert.tag_json import (
    NUMBER_CHARS,
    may_be_number,
    strict_schema,
    whitespace_options,
)
from guidedec.grammar.convert.tag_tail import Tail


class FormatWriter:
    """Writes one format as a Lark expression that also consumes what its :class:`Tail` asks.

    ``_fmt_<type>`` writes format type ``<type>``; the subclasses :class:`CombinatorWriter` and
    :class:`DispatchWriter` add the format types that contain other formats."""

    def __init__(self) -> None:
        self.out = LarkWriter()

    def emit(self, fmt: Any, tail: Tail) -> str:
        """Lark for the format ``fmt``, followed by what ``tail`` asks."""
        if not isinstance(fmt, Mapping):
            raise ValueError(f"structural tag format must be an object, got {fmt!r:.60}")
        handler = getattr(self, f"_fmt_{fmt.get('type')}", None)
        if handler is None or not isinstance(fmt.get("type"), str):
            raise ValueError(f"unknown structural tag format type {fmt.get('type')!r}")
        return str(handler(fmt, tail))

    def then(self, body: str, tail: Tail) -> str:
        """``body``, then one of ``tail.ends`` where the format itself must write them."""
        return f"{body} {self.one_of(tail.ends)}" if tail.kind == "ends" else body

    @staticmethod
    def one_of(strings: Sequence[str]) -> str:
        """Any one of ``strings``, each as one-character lexemes."""
        return "(" + " | ".join(lark_chars(s) for s in strings) + ")"

    def terminal_rule(self, hint: str, terminal: str, *, lazy: bool = False) -> str:
        """A rule whose body is one lexeme (``lazy``: the shortest match ends it)."""
        name = self.out.fresh(hint)
        self.out.lines.append(f"{name.upper()}: {terminal}")
        self.out.lines.append(f"{name}{'[lazy]' if lazy else ''}: {name.upper()}")
        return name

    def free_text(self, what: str, stops: Sequence[str], tail: Tail, max_chars: Any = None) -> str:
        """Free text avoiding ``stops``; it ends the grammar or runs up to one of ``tail.ends``.

        Free text is one lexeme, so no other parse may be alive where it starts: llguidance
        extends a lexeme as long as it can, which would cut off that other parse."""
        if not tail.alone:
            raise ValueError(
                f"{what} must start where nothing else can (after a fixed text that tells it "
                "apart), not beside another alternative, optional or repeated part"
            )
        limit = f" & /(?s:.){{0,{max_chars}}}/" if max_chars is not None else ""
        if tail.kind == "eof":
            if max_chars == 0:
                return '""'
            return self.terminal_rule("text", avoiding(stops, nonempty=True) + limit) + "?"
        if tail.kind == "ends":
            check_separable(tail.ends, [], what)  # excludes bind the text, not the end
            ends = "|".join(rx(s) for s in tail.ends)
            body = f"({avoiding(stops)}{limit}) /(?:{ends})/"
            return self.terminal_rule("text", body, lazy=True)
        raise ValueError(f"{what} must end the structural tag or the content of a tag")

    # -- basic formats ---------------------------------------------------------------------

    def _fmt_const_string(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        return self.then(lark_chars(format_field(fmt, "value", str)), tail)

    def _fmt_json_schema(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        schema = format_field(fmt, "json_schema", (bool, dict))
        if format_field(fmt, "style", str, "json") != "json":
            raise ValueError(f"json_schema style {fmt['style']!r} has no llguidance equivalent")
        for key, default in (("any_order", False), ("excludes", [])):
            if fmt.get(key, default) != default:
                raise ValueError(f"json_schema option {key!r} has no llguidance equivalent")
        if schema is False:
            raise ValueError("json_schema false matches nothing")
        strict = strict_schema({} if schema is True else schema)
        whitespace = format_field(fmt, "max_whitespace_cnt", (int, type(None)), None)
        if whitespace is not None:
            strict["x-guidance"] = whitespace_options(whitespace)
        following = tail.first_chars()
        if may_be_number(strict) and (following is None or set(following) & set(NUMBER_CHARS)):
            # llguidance lexes a JSON number greedily: "12" then "5" is read as "125"
            raise ValueError(
                "json_schema that may be a bare number must not be followed by text that could "
                "continue the number (llguidance would read it as part of the number)"
            )
        body = json.dumps(strict)
        return self.then(self.out.rule(self.out.fresh("json"), f"%json {body}"), tail)

    def _fmt_qwen_xml_parameter(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        raise ValueError("format type 'qwen_xml_parameter' has no llguidance equivalent")

    def _fmt_grammar(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        text = format_field(fmt, "grammar", str)
        syntax = format_field(fmt, "syntax", str, "ebnf")
        if syntax == "lark":  # xgrammar reads Lark character by character, not greedily
            text = xgrammar_ebnf("from_lark", text)
        elif syntax != "ebnf":
            raise ValueError(f"grammar syntax {syntax!r} is not 'ebnf' or 'lark'")
        return self.then(self.sub_grammar(text), tail)

    def _fmt_regex(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        text = xgrammar_ebnf("from_regex", format_field(fmt, "pattern", str))
        return self.then(self.sub_grammar(text), tail)

    def sub_grammar(self, ebnf: str) -> str:
        grammar, attributes = parse_ebnf(ebnf)
        if attributes:
            raise ValueError("rule attributes inside a structural tag grammar cannot be converted")
        return self.out.add_grammar(grammar, root=self.out.fresh("grammar"))

    def _fmt_any_text(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        if fmt.get("max_tokens") is not None:
            raise ValueError("any_text max_tokens (a token budget) cannot be converted")
        excludes = strings(fmt, "excludes")
        max_chars = format_field(fmt, "max_chars", (int, type(None)), None)
        return self.free_text("any_text", excludes, tail, max_chars)

    # -- tokens ----------------------------------------------------------------------------

    def token(self, fmt: Any) -> str:
        if not isinstance(fmt, Mapping) or fmt.get("type", "token") != "token":
            raise ValueError(f"expected a string or a token format, got {fmt!r:.60}")
        return token_ref(fmt.get("token"))

    def _fmt_token(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        return self.then(self.token(fmt), tail)

    def _fmt_exclude_token(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        return self.then(token_set(fmt, "exclude_tokens", negated=True), tail)

    def _fmt_any_tokens(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        if fmt.get("max_tokens") is not None:
            raise ValueError("any_tokens max_tokens (a token budget) cannot be converted")
        return self.then(token_set(fmt, "exclude_tokens", negated=True) + "*", tail)
