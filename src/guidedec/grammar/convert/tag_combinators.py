"""The second layer of the structural-tag writer: formats made of other formats (sequence, or,
optional, star, plus, repeat, tag, tags_with_separator)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from guidedec.grammar.convert.ebnf_writers import lark_chars, repeat_suffix
from guidedec.grammar.convert.tag_analysis import (
    clear_of,
    ends_alone,
    first_char,
    fixed_prefix,
    told_apart,
)
from guidedec.grammar.convert.tag_fields import format_field, nonempty_list, strings
from guidedec.grammar.convert.tag_tail import Tail
from guidedec.grammar.convert.tag_writer import FormatWriter


class CombinatorWriter(FormatWriter):
    """:class:`FormatWriter` plus the formats that combine other formats."""

    def _fmt_sequence(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        elements = nonempty_list(fmt, "elements")
        parts, alone = [], tail.alone
        for element, after in itertools.pairwise(elements):
            parts.append(self.emit(element, Tail("opaque", first=first_char(after), alone=alone)))
            alone = alone and ends_alone(element)
        return " ".join([*parts, self.emit(elements[-1], tail.but(alone=alone))])

    def _fmt_or(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        elements = nonempty_list(fmt, "elements")
        prefixes = [fixed_prefix(e) for e in elements]
        alternatives = [
            self.emit(e, tail.but(alone=told_apart(prefixes, i))) for i, e in enumerate(elements)
        ]
        return "(" + " | ".join(alternatives) + ")"

    def _fmt_optional(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        content = format_field(fmt, "content", dict)
        if content.get("type") == "any_text" and content.get("max_tokens") is None:
            return self.emit(content, tail)  # free text may be empty already
        inner = self.emit(content, tail.but(alone=clear_of(fixed_prefix(content), tail)))
        if tail.kind == "ends":
            return f"({inner} | {self.one_of(tail.ends)})"
        return f"({inner})?"

    def repeated(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        """The content of star / plus / repeat: after each copy, another or what follows."""
        content = format_field(fmt, "content", dict)
        alone = ends_alone(content) and clear_of(fixed_prefix(content), tail)
        return self.emit(content, Tail("opaque", first=first_char(content), alone=alone))

    def _fmt_star(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        return self.then(f"({self.repeated(fmt, tail)})*", tail)

    def _fmt_plus(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        return self.then(f"({self.repeated(fmt, tail)})+", tail)

    def _fmt_repeat(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        lo, hi = format_field(fmt, "min", int), format_field(fmt, "max", int)
        if lo < 0 or (hi != -1 and hi < lo):
            raise ValueError(f"repeat range min={lo}, max={hi} is invalid")
        if hi == 0:
            return self.then('""', tail)
        body = self.repeated(fmt, tail)
        return self.then(f"({body}){repeat_suffix(lo, None if hi == -1 else hi)}", tail)

    def _fmt_tag(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        return self.then(self.tag(fmt, alone=tail.alone), tail)

    def tag(self, fmt: Any, *, alone: bool, skip: int = 0, with_begin: bool = True) -> str:
        """A tag (begin, content, end), without the first ``skip`` characters of its begin
        (or without its begin at all); ``alone``: no other parse is alive after the begin."""
        if not isinstance(fmt, Mapping) or fmt.get("type", "tag") != "tag":
            raise ValueError("structural tag 'tags' must hold formats of type 'tag'")
        begin, end = fmt.get("begin"), fmt.get("end")
        head = lark_chars(begin[skip:]) if isinstance(begin, str) else self.token(begin)
        head = head if with_begin else ""
        content = format_field(fmt, "content", dict)
        if isinstance(end, str) or (isinstance(end, list) and end):
            ends = (end,) if isinstance(end, str) else tuple(strings(fmt, "end"))
            return f"{head} {self.emit(content, Tail('ends', ends, alone=alone))}"
        return f"{head} {self.emit(content, Tail('opaque', alone=alone))} {self.token(end)}"

    def _fmt_tags_with_separator(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        tags = nonempty_list(fmt, "tags")
        separator = format_field(fmt, "separator", str)
        at_least_one = format_field(fmt, "at_least_one", bool, False)
        begins = [fixed_prefix(t) for t in tags]

        def alone(i: int) -> bool:  # after a tag comes the separator or what follows
            next_ok = clear_of(separator or begins[i], tail) and ends_alone(tags[i])
            first_ok = at_least_one or clear_of(begins[i], tail)
            return tail.alone and told_apart(begins, i) and next_ok and first_ok

        one = "(" + " | ".join(self.tag(t, alone=alone(i)) for i, t in enumerate(tags)) + ")"
        sep = lark_chars(separator)
        stop_after_first = format_field(fmt, "stop_after_first", bool, False)
        body = one if stop_after_first else f"{one} ({sep} {one})*"
        return self.then(body if at_least_one else f"({body})?", tail)
