"""Static analysis of structural-tag formats: fixed prefixes and first characters, and whether
a format starts or ends where no other parse is alive (llguidance free text needs that)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from guidedec.grammar.convert.ebnf_ast import Alt, CharClass, Lit, Node, Repeat, Seq
from guidedec.grammar.convert.ebnf_parser import parse_ebnf
from guidedec.grammar.convert.tag_fields import xgrammar_ebnf
from guidedec.grammar.convert.tag_tail import Tail


def first_char(fmt: Any) -> str | None:
    """The first character a format writes, where it is one fixed character."""
    if isinstance(fmt, Mapping) and fmt.get("type") == "const_string":
        value = fmt.get("value")
    elif isinstance(fmt, Mapping) and fmt.get("type") == "tag":
        value = fmt.get("begin")
    else:
        return None
    return value[0] if isinstance(value, str) and value else None


def fixed_prefix(fmt: Any) -> str:
    """Text every match of a format starts with (as far as cheaply known)."""
    if not isinstance(fmt, Mapping):
        return ""
    kind = fmt.get("type")
    if kind == "const_string" and isinstance(fmt.get("value"), str):
        return str(fmt["value"])
    if kind == "tag" and isinstance(fmt.get("begin"), str):
        return str(fmt["begin"]) or fixed_prefix(fmt.get("content"))
    if kind == "sequence" and isinstance(fmt.get("elements"), list) and fmt["elements"]:
        head, *rest = fmt["elements"]
        prefix = fixed_prefix(head)
        if rest and isinstance(head, Mapping) and head.get("type") == "const_string":
            prefix += fixed_prefix({"type": "sequence", "elements": rest})
        return prefix
    return ""


def told_apart(prefixes: Sequence[str], i: int) -> bool:
    """Whether alternative ``i`` is the only one alive once its fixed prefix has been read."""
    if len(prefixes) == 1:
        return True
    mine = prefixes[i]
    return bool(mine) and all(
        other and not (mine.startswith(other) or other.startswith(mine))
        for j, other in enumerate(prefixes)
        if j != i
    )


def _apart(a: str, b: str) -> bool:
    """Whether two fixed texts differ before either ends."""
    return bool(a) and bool(b) and not (a.startswith(b) or b.startswith(a))


def clear_of(prefix: str, tail: Tail) -> bool:
    """Whether text starting with ``prefix`` cannot be mistaken for what follows."""
    if tail.kind == "ends":
        return all(_apart(prefix, end) for end in tail.ends)
    following = tail.first_chars()
    return following == "" or (
        bool(prefix) and following is not None and prefix[0] not in following
    )


def _settles(content: Any, ends: Sequence[str]) -> bool:
    """Whether, after ``content`` and one of ``ends``, no other parse is alive."""
    kind = content.get("type") if isinstance(content, Mapping) else None
    if kind == "tags_with_separator":
        tags = content.get("tags", [])
        begins = [fixed_prefix(t) for t in tags]
        again = [content.get("separator", "")] if content.get("separator") else begins
        return all(ends_alone(t) for t in tags) and all(
            _apart(n, e) for n in [*again, *begins] for e in ends
        )
    if kind in ("optional", "star", "plus", "repeat"):
        inner = content.get("content")
        return ends_alone(inner) and all(_apart(fixed_prefix(inner), e) for e in ends)
    return ends_alone(content)


def ends_alone(fmt: Any) -> bool:
    """Whether, started with no other parse alive, a format also ends with none alive."""
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind in ("const_string", "token", "exclude_token"):
        return True
    if kind == "json_schema":  # a number here was refused unless nothing can continue it
        return True
    if kind == "sequence":
        elements = fmt.get("elements", [])
        return all(
            ends_alone(e) or (after is not None and _cut_off(e, first_char(after)))
            for e, after in zip(elements, [*elements[1:], None], strict=True)
        )
    if kind == "or":
        elements = fmt.get("elements", [])
        prefixes = [fixed_prefix(e) for e in elements]
        told = all(told_apart(prefixes, i) for i in range(len(elements)))
        return told and all(ends_alone(e) for e in elements)
    if kind == "tag":
        content, end = fmt.get("content"), fmt.get("end")
        ends = [end] if isinstance(end, str) else end if isinstance(end, list) else []
        apart = not any(a != b and b.startswith(a) for a in ends for b in ends)
        return _ends_in_free_text(content) or (apart and _settles(content, ends))
    return False


def _cut_off(fmt: Any, char: str | None) -> bool:
    """Whether ``char`` cannot occur in a regex format, so that any parse still inside it dies
    when ``char`` comes (then what follows is read alone)."""
    if char is None or not isinstance(fmt, Mapping) or fmt.get("type") != "regex":
        return False
    try:
        grammar, _ = parse_ebnf(xgrammar_ebnf("from_regex", str(fmt.get("pattern"))))
    except ValueError:
        return False
    return not any(_may_match(node, ord(char)) for node in _walk(grammar.rules.values()))


def _walk(nodes: Any) -> Any:
    for node in nodes:
        yield node
        if isinstance(node, (Seq, Alt)):
            yield from _walk(node.items)
        elif isinstance(node, Repeat):
            yield from _walk([node.item])


def _may_match(node: Node, cp: int) -> bool:
    if isinstance(node, Lit):
        return chr(cp) in node.text
    if isinstance(node, CharClass):
        inside = any(lo <= cp <= hi for lo, hi in node.ranges)
        return inside != node.negated
    return False


def _ends_in_free_text(fmt: Any) -> bool:
    """Whether a tag's content ends in free text, which then also reads the tag's end."""
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind in ("any_text", "triggered_tags", "dispatch"):
        return True
    if kind == "sequence" and fmt.get("elements"):
        return _ends_in_free_text(fmt["elements"][-1])
    return kind == "optional" and _ends_in_free_text(fmt.get("content"))
