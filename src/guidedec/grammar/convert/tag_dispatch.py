"""The last layer of the structural-tag writer: free text with dispatch (triggered_tags,
dispatch) and its token forms (token_triggered_tags, token_dispatch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from guidedec.grammar.convert.tag_analysis import ends_alone, fixed_prefix, told_apart
from guidedec.grammar.convert.tag_combinators import CombinatorWriter
from guidedec.grammar.convert.tag_fields import (
    format_field,
    nonempty_list,
    strings,
    token_ids,
    token_set,
)
from guidedec.grammar.convert.tag_free_text import avoiding, check_separable, rx
from guidedec.grammar.convert.tag_tail import Tail


class DispatchWriter(CombinatorWriter):
    """:class:`CombinatorWriter` plus free text with dispatch: the writer of every format type."""

    def _fmt_triggered_tags(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        triggers = strings(fmt, "triggers")
        if not triggers:
            raise ValueError("triggered_tags needs at least one trigger")
        tags = nonempty_list(fmt, "tags")
        by_trigger: dict[str, list[Any]] = {t: [] for t in triggers}
        for tag in tags:
            begin = tag.get("begin") if isinstance(tag, Mapping) else None
            if not isinstance(begin, str):
                raise ValueError(
                    "triggered_tags tags need string begins (use token_triggered_tags)"
                )
            matching = [t for t in triggers if begin.startswith(t)]
            if len(matching) != 1:
                raise ValueError(f"tag begin {begin!r} must start with exactly one trigger")
            by_trigger[matching[0]].append(tag)

        def group(trigger: str, after: Tail) -> str:
            rests = [fixed_prefix(t)[len(trigger) :] for t in by_trigger[trigger]]
            body = " | ".join(
                self.tag(t, alone=after.alone and told_apart(rests, i), skip=len(trigger))
                for i, t in enumerate(by_trigger[trigger])
            )
            return self.then(f"({body})", after)

        rules = [(t, group) for t in triggers if by_trigger[t]]
        excludes = strings(fmt, "excludes")
        begins = [fixed_prefix(t) for t in tags]
        first = " | ".join(
            self.tag(t, alone=tail.alone and told_apart(begins, i)) for i, t in enumerate(tags)
        )
        return self.first_then_dispatch(
            fmt,
            tail,
            f"({first})",
            lambda loop: self.dispatch(fmt["type"], rules, excludes, tail, loop=loop, after=tags),
        )

    def first_then_dispatch(
        self, fmt: Mapping[str, Any], tail: Tail, first: str, dispatch: Any
    ) -> str:
        """xgrammar's reading of at_least_one / stop_after_first: the first tag comes at once
        (no text before it) when at least one is required; the dispatch loops unless stopped."""
        at_least_one = format_field(fmt, "at_least_one", bool, False)
        stop_after_first = format_field(fmt, "stop_after_first", bool, False)
        if at_least_one and stop_after_first:
            return self.then(first, tail)
        rest = str(dispatch(not stop_after_first))
        return f"{first} {rest}" if at_least_one else rest

    def _fmt_dispatch(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        formats: dict[str, Any] = {}
        for rule in nonempty_list(fmt, "rules"):
            if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)):
                raise ValueError("dispatch rules must be [pattern, format] pairs")
            formats[rule[0]] = rule[1]
        rules = [(p, lambda p, after: self.emit(formats[p], after)) for p in formats]
        loop = format_field(fmt, "loop", bool, True)
        excludes = strings(fmt, "excludes")
        return self.dispatch("dispatch", rules, excludes, tail, loop=loop, after=formats.values())

    def dispatch(
        self,
        what: str,
        rules: list[tuple[str, Any]],
        excludes: list[str],
        tail: Tail,
        *,
        loop: bool,
        after: Any,
    ) -> str:
        """xgrammar's TagDispatch: free text; each trigger (which free text never contains)
        starts its rule; with ``loop`` free text resumes after it, else the format ends.
        ``after``: the formats a trigger may start (free text follows them when looping)."""
        triggers = [t for t, _ in rules]
        ends = tail.ends if tail.kind == "ends" else ()
        stops = [*triggers, *excludes, *ends]
        check_separable(triggers, excludes, what)
        check_separable([*triggers, *ends], [], what)
        lead_ins = [
            self.terminal_rule("trigger", f"({avoiding(stops)}) /{rx(t)}/", lazy=True)
            for t in triggers
        ]
        resumes = loop and all(ends_alone(f) for f in after)
        final = self.free_text(what, [*triggers, *excludes], tail.but(alone=resumes or not loop))
        rest = Tail("opaque", alone=tail.alone) if loop else tail
        pairs = zip(lead_ins, rules, strict=True)
        branches = [f"{lead} {body(t, rest)}" for lead, (t, body) in pairs]
        if loop:
            return f"({' | '.join(branches)})* {final}"
        return "(" + " | ".join([*branches, final]) + ")"

    # -- tokens ----------------------------------------------------------------------------

    def _fmt_token_triggered_tags(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        triggers = token_ids(fmt, "trigger_tokens")
        tags = nonempty_list(fmt, "tags")
        by_trigger: dict[int, list[str]] = {t: [] for t in triggers}
        for tag in tags:
            begin = tag.get("begin") if isinstance(tag, Mapping) else None
            token = begin.get("token") if isinstance(begin, Mapping) else None
            if token not in by_trigger:
                raise ValueError(
                    f"token_triggered_tags tag begin {begin!r:.60} is no trigger token"
                )
            by_trigger[token].append(tag)
        rules = [
            (t, "(" + " | ".join(self.token_tag(by_trigger[t], tail, with_begin=False)) + ")")
            for t in triggers
            if by_trigger[t]
        ]
        excludes = token_ids(fmt, "exclude_tokens")
        first = "(" + " | ".join(self.token_tag(tags, tail, with_begin=True)) + ")"
        return self.first_then_dispatch(
            fmt, tail, first, lambda loop: self.token_dispatch(rules, excludes, tail, loop=loop)
        )

    def token_tag(self, tags: list[Any], tail: Tail, *, with_begin: bool) -> list[str]:
        alone = tail.alone and len(tags) == 1
        return [self.tag(t, alone=alone, with_begin=with_begin) for t in tags]

    def _fmt_token_dispatch(self, fmt: Mapping[str, Any], tail: Tail) -> str:
        rules = []
        for rule in nonempty_list(fmt, "rules"):
            if not (isinstance(rule, Sequence) and len(rule) == 2):
                raise ValueError("token_dispatch rules must be [token, format] pairs")
            token = token_ids({"type": "token_dispatch", "t": [rule[0]]}, "t")[0]
            rules.append((token, self.emit(rule[1], Tail("opaque", alone=tail.alone))))
        excludes = token_ids(fmt, "exclude_tokens")
        return self.token_dispatch(
            rules, excludes, tail, loop=format_field(fmt, "loop", bool, True)
        )

    def token_dispatch(
        self, rules: list[tuple[int, str]], excludes: list[int], tail: Tail, *, loop: bool
    ) -> str:
        """xgrammar's TokenTagDispatch: any tokens but triggers and excluded ones; a trigger
        token starts its rule. Tokens are whole lexemes, so no delimiter analysis is needed."""
        free = token_set({"ids": [t for t, _ in rules] + excludes}, "ids", negated=True) + "*"
        branches = [f"<[{t}]> {body}" for t, body in rules]
        if loop:
            return self.then(f"({free} ({' | '.join(branches)}))* {free}", tail)
        endings = [self.then(b, tail) for b in branches] + [self.then('""', tail)]
        return f"{free} ({' | '.join(endings)})"
