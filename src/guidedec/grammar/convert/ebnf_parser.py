"""The EBNF parser: xgrammar 0.2.9's grammar rules, plus three GBNF (llama.cpp) forms whose
meaning is unambiguous: empty alternatives, ``.`` for any character and ``{,n}``."""

from __future__ import annotations

from guidedec.grammar.convert.ebnf_ast import ANY_CHAR, Alt, Grammar, Lit, Node, Ref, Repeat, Seq
from guidedec.grammar.convert.ebnf_lexer import Lexer, Token

_SEQUENCE_END = frozenset({"|", ")", "(=", "rule", "eof"})
_MACROS = frozenset({"TagDispatch", "Token", "ExcludeToken", "TokenTagDispatch", "Regex"})
_MAX_NESTING = 150


class _Parser:
    """Recursive descent over the tokens; rules go into :attr:`grammar` in definition order."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens, self.i, self.depth = tokens, 0, 0
        self.grammar = Grammar()
        self.attributes: dict[str, str] = {}
        self.rule_names = {t.value[0] for t in tokens if t.kind == "rule"}

    def error(self, message: str, tok: Token | None = None) -> ValueError:
        tok = tok or self.peek()
        return ValueError(f"EBNF syntax error at line {tok.line}, column {tok.col}: {message}")

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self, kind: str, what: str) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            raise self.error(f"expected {what}, got {_describe(tok)}")
        self.i += 1
        return tok

    def parse(self) -> Grammar:
        seen: set[str] = set()
        for tok in self.tokens:
            if tok.kind == "rule" and tok.value[0] in seen:
                raise self.error(f"rule {tok.value[0]!r} is defined more than once", tok)
            if tok.kind == "rule":
                seen.add(tok.value[0])
        if "root" not in seen:
            raise ValueError("EBNF grammar has no root rule (expected a rule named 'root')")
        while self.peek().kind != "eof":
            self.rule()
        return self.grammar

    def rule(self) -> None:
        name, attributes = self.take("rule", "a rule name at the start of a line").value
        self.take("::=", "'::='")
        self.grammar.rules[name] = self.choices()
        if attributes:
            self.attributes[name] = attributes
        if self.peek().kind == "(=":
            self.i += 1
            self.grammar.lookaheads[name] = self.choices()
            self.take(")", "')' closing the lookahead assertion")

    def choices(self) -> Node:
        options = [self.sequence()]
        while self.peek().kind == "|":
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek().kind not in _SEQUENCE_END:  # GBNF: an empty sequence is allowed
            items.append(self.quantified())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self) -> Node:
        item = self.element()
        kind = self.peek().kind
        if kind in ("*", "+", "?"):
            self.i += 1
            return Repeat(item, 1 if kind == "+" else 0, 1 if kind == "?" else None)
        if kind == "{":
            return self.repetition(item)
        return item

    def repetition(self, item: Node) -> Node:
        brace = self.take("{", "'{'")
        lo = 0 if self.peek().kind == "," else self.take("int", "a repetition count").value
        if self.peek().kind == "}":
            self.i += 1
            return Repeat(item, lo, lo)
        self.take(",", "',' or '}' in the repetition range")
        hi: int | None
        if self.peek().kind == "}":
            hi = None
        elif self.peek().kind == "ident" and self.peek().value[0] == "-1":
            self.i, hi = self.i + 1, None
        else:
            hi = self.take("int", "a repetition bound").value
        self.take("}", "'}' closing the repetition range")
        if hi is not None and hi < lo:
            raise self.error(f"repetition range {{{lo},{hi}}} has lower bound above upper", brace)
        return Repeat(item, lo, hi)

    def element(self) -> Node:
        tok = self.peek()
        self.i += 1
        if tok.kind == "str":
            return Lit(tok.value)
        if tok.kind == "class":
            return tok.value  # type: ignore[no-any-return]
        if tok.kind == "(":
            return self.group(tok)
        if tok.kind == "ident":
            return self.reference(tok)
        raise self.error(f"expected an element, got {_describe(tok)}", tok)

    def group(self, tok: Token) -> Node:
        if self.peek().kind == ")":
            self.i += 1
            return Lit("")
        self.depth += 1
        if self.depth > _MAX_NESTING:
            raise self.error(f"parentheses nested more than {_MAX_NESTING} deep", tok)
        inner = self.choices()
        self.take(")", "')'")
        self.depth -= 1
        return inner

    def reference(self, tok: Token) -> Node:
        name = tok.value[0]
        if name in _MACROS:
            raise self.error(f"xgrammar macro {name}(...) has no equivalent here", tok)
        if name in self.rule_names:
            return Ref(name)
        if set(name) == {"."}:  # GBNF: '.' is any character
            return ANY_CHAR if len(name) == 1 else Seq((ANY_CHAR,) * len(name))
        raise self.error(f"rule {name!r} is not defined", tok)


def _describe(tok: Token) -> str:
    if tok.kind == "eof":
        return "end of input"
    if tok.kind in ("ident", "rule"):
        return f"name {tok.value[0]!r}"
    if tok.kind in ("str", "int"):
        return f"{tok.kind} {tok.value!r}"
    return "a character class" if tok.kind == "class" else repr(tok.kind)


def parse_ebnf(text: str) -> tuple[Grammar, dict[str, str]]:
    """Parse EBNF into rules; also returns the raw rule attribute blocks (``name[...] ::=``)."""
    if not isinstance(text, str):
        raise ValueError(f"EBNF grammar must be a string, got {type(text).__name__}")
    parser = _Parser(Lexer(text).tokens())
    return parser.parse(), parser.attributes
