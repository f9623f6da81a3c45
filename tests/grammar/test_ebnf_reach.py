"""An EBNF grammar's reach bounds the shortest completion from every state its outputs pass
through."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from guidedec.bitmask import allocate_bitmask
from guidedec.errors import MatcherError
from guidedec.grammar.convert.ebnf_ast import Alt, CharClass, Grammar, Lit, Node, Ref, Repeat, Seq
from guidedec.grammar.convert.ebnf_parser import parse_ebnf
from guidedec.grammar.ebnf_reach import NO_END, ebnf_reach
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.grammar.schema_reach import MAX_REACH, guide_reach
from guidedec.testing.generate import sample_allowed_token
from guidedec.tokenizer import TokenizerInfo


def _bytes(text: str) -> int:
    return len(text.encode())


def test_a_branch_counts_what_it_commits_to() -> None:
    assert ebnf_reach('root ::= "a"', _bytes) == 1
    assert ebnf_reach('root ::= "a" | "b" "c"{200}', _bytes) == 201  # after "b": 200 more
    assert ebnf_reach('root ::= "b" "c"{200,} | "a"', _bytes) == 201
    assert ebnf_reach('root ::= ("ab" "cd"){3} "!"', _bytes) == 2 + 2 + 2 * 4 + 1


def test_a_sequence_adds_what_follows_the_farthest_point() -> None:
    grammar = 'root ::= "[" item ("," item)* "]"\nitem ::= "q" [0-9]{5}'
    # after "[" or ",": an item ("q" and five digits) and "]"
    assert ebnf_reach(grammar, _bytes) == 1 + 6 + 1
    assert ebnf_reach('root ::= "x" tail\ntail ::= "y"{40}', _bytes) == 41


def test_a_character_class_counts_one_character() -> None:
    assert ebnf_reach("root ::= [a-z]{10}", _bytes) == 10
    assert ebnf_reach("root ::= [^\\x00-\\x7f]{10}", _bytes) == 40  # no ASCII: four bytes
    assert ebnf_reach('root ::= [^"]{10}', _bytes) == 10


def test_a_recursion_counts_one_level_and_an_endless_one_has_no_end() -> None:
    nested = 'root ::= value\nvalue ::= "[" (value ("," value)*)? "]" | "0"'
    assert ebnf_reach(nested, _bytes) == 3  # "[" then "0]" (one level)
    assert ebnf_reach('root ::= "x" root', _bytes) == NO_END
    assert ebnf_reach('root ::= "a" | "b" loop\nloop ::= "c" loop', _bytes) == NO_END


def test_unreadable_grammars_get_none_and_guides_are_dispatched() -> None:
    assert ebnf_reach("root ::= undefined", _bytes) is None  # does not parse
    assert ebnf_reach('start ::= "a"', _bytes) is None  # no root rule
    assert guide_reach(GuidedDecodingParams(ebnf='root ::= "a"{70}')) == 70
    assert guide_reach(GuidedDecodingParams(ebnf='root ::= "x" root')) == MAX_REACH
    assert guide_reach(GuidedDecodingParams(lark='start: "a"')) is None


# --- the bound against the exact shortest completion, at every point of random outputs ------

_LITERALS = st.text(alphabet="abcxyz{},:0 ", min_size=1, max_size=12).map(lambda t: f'"{t}"')
_CLASSES = st.sampled_from(["[a-c]", "[0-9]", "[xyz]"])


def _repeat(item: str, lo: int, extra: int | None) -> str:
    if extra is None:
        return f"({item}){{{lo},}}"
    return f"({item}){{{lo},{lo + extra}}}"


def _nodes(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    sequences = st.lists(children, min_size=2, max_size=3).map(" ".join)
    branches = st.lists(children, min_size=2, max_size=3).map(lambda xs: f"({' | '.join(xs)})")
    repeats = st.builds(_repeat, children, st.integers(0, 6), st.none() | st.integers(0, 3))
    return sequences | branches | repeats


_BODIES = st.recursive(_LITERALS | _CLASSES, _nodes, max_leaves=6)


@st.composite
def _grammars(draw: st.DrawFn) -> str:
    """A root and up to two helper rules, each referring to those defined before it (no
    recursion: the reach bounds nesting the model opens for one level only)."""
    rules: list[str] = []
    for index in range(draw(st.integers(0, 2))):
        body = draw(_BODIES)
        if rules and draw(st.booleans()):
            body = f"{body} r{draw(st.integers(0, index - 1))}"
        rules.append(f"r{index} ::= {body}")
    root = draw(_BODIES)
    if rules:
        root = f"{root} | {' '.join(f'r{i}' for i in range(len(rules)))}"
    return "\n".join([f"root ::= {root}", *rules])


class _Nfa:
    """A non-recursive grammar as an automaton over characters (Thompson's construction): the
    oracle of the shortest completion, in characters, from a prefix."""

    def __init__(self, grammar: Grammar) -> None:
        self.rules = grammar.rules
        self.eps: list[list[int]] = []
        self.chars: list[list[tuple[CharClass, int]]] = []
        self.start = self._new()
        self.final = self._build(self.rules["root"], self.start)

    def _new(self) -> int:
        self.eps.append([])
        self.chars.append([])
        return len(self.eps) - 1

    def _build(self, node: Node, start: int) -> int:
        """Edges from ``start`` that read ``node``; returns the state after it."""
        if isinstance(node, Lit):
            for ch in node.text:
                state = self._new()
                self.chars[start].append((CharClass(((ord(ch), ord(ch)),)), state))
                start = state
            return start
        if isinstance(node, CharClass):
            state = self._new()
            self.chars[start].append((node, state))
            return state
        if isinstance(node, Ref):
            return self._build(self.rules[node.name], start)
        if isinstance(node, Seq):
            for item in node.items:
                start = self._build(item, start)
            return start
        if isinstance(node, Alt):
            end = self._new()
            for item in node.items:
                self.eps[self._build(item, self._branch(start))].append(end)
            return end
        assert isinstance(node, Repeat)
        for _ in range(node.lo):
            start = self._build(node.item, start)
        if node.hi is None:
            loop = self._branch(start)
            self.eps[self._build(node.item, loop)].append(loop)
            return self._branch(loop)
        for _ in range(node.hi - node.lo):
            end = self._new()
            self.eps[self._build(node.item, self._branch(start))].append(end)
            self.eps[start].append(end)
            start = end
        return start

    def _branch(self, start: int) -> int:
        state = self._new()
        self.eps[start].append(state)
        return state

    def _closure(self, states: set[int]) -> set[int]:
        stack = list(states)
        while stack:
            for target in self.eps[stack.pop()]:
                if target not in states:
                    states.add(target)
                    stack.append(target)
        return states

    def read(self, text: str) -> set[int]:
        states = self._closure({self.start})
        for ch in text:
            moved = {t for s in states for cls, t in self.chars[s] if _matches(cls, ch)}
            states = self._closure(moved)
        return states

    def shortest_completion(self, states: set[int]) -> int:
        """Characters from ``states`` to the final state (0-1 breadth-first search)."""
        distance = dict.fromkeys(states, 0)
        queue = deque(states)
        while queue:
            state = queue.popleft()
            if state == self.final:
                return distance[state]
            for cost, targets in ((0, self.eps[state]), (1, [t for _, t in self.chars[state]])):
                for target in targets:
                    if distance[state] + cost < distance.get(target, NO_END):
                        distance[target] = distance[state] + cost
                        (queue.appendleft if cost == 0 else queue.append)(target)
        return NO_END


def _matches(cls: CharClass, ch: str) -> bool:
    inside = any(lo <= ord(ch) <= hi for lo, hi in cls.ranges)
    return inside != cls.negated


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(grammar=_grammars(), seed=st.integers(0, 2**16))
def test_from_every_point_of_a_random_output_the_shortest_completion_is_within_the_reach(
    make_factory: Callable[..., GrammarMatcherFactory],
    tokenizer: TokenizerInfo,
    backend: str,
    grammar: str,
    seed: int,
) -> None:
    """The reach in characters (every literal here is ASCII) against the exact shortest
    completion, read from the grammar's automaton, at every character of a random-logits
    output the backend guided (up to 48 tokens)."""
    reach = ebnf_reach(grammar, _bytes)
    assert reach is not None and reach < NO_END
    nfa = _Nfa(parse_ebnf(grammar)[0])
    assume(len(nfa.eps) < 4000)
    matcher = make_factory(backend).create(GuidedDecodingParams(ebnf=grammar))
    rng = np.random.default_rng(seed)
    rows = allocate_bitmask(1, tokenizer.vocab_size)
    stops = set(tokenizer.stop_token_ids)
    written: list[int] = []
    for _ in range(48):
        try:
            matcher.fill_next_token_bitmask(rows, 0)
        except MatcherError:  # llguidance's item limit on an ambiguous grammar: stop there
            break
        token = sample_allowed_token(rows[0].numpy(), tokenizer.vocab_size, rng)
        if token in stops:
            break
        assert matcher.accept_token(token)
        written.append(token)
    text = tokenizer.decode(written)
    for end in range(len(text) + 1):
        shortest = nfa.shortest_completion(nfa.read(text[:end]))
        assert shortest <= reach, f"{shortest} characters to complete {text[:end]!r}"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet='root:=|()[]{}*+?"ab0,^\\ \n-', max_size=40))
def test_any_text_as_a_grammar_gets_a_bounded_reach_or_none(text: str) -> None:
    """Whatever a request sends as its grammar, the reach is computed without an error."""
    reach = ebnf_reach(text, _bytes)
    assert reach is None or 0 <= reach <= NO_END
