"""The tasks of ``guidedec bench quality``: each item a chat, the JSON schema its answer must
follow, and a judge of the answer.

- ``extraction``: the sixty sentences of :mod:`guidedec.bench.extraction_set`, a person's
  record each; scored by field (four per sentence).
- ``bfcl <category>``: BFCL questions (``simple_python``, ``multiple``, ``parallel``,
  ``parallel_multiple``) with their functions described in the system turn; the answer is a
  JSON array of calls (``{"name", "arguments"}``), scored by BFCL's AST check
  (:func:`guidedec.bench.bfcl.correct`).
- ``puzzles``: questions of :mod:`guidedec.bench.quality.puzzles` whose answer is one JSON
  field, after an invitation to think first.

Every output is judged the same way, guided or not: the answer is the whole output where that
parses as JSON, else the first JSON value in it that has the answer's shape (unguided replies
wrap it in prose or code fences; of an array cut short, the items it completed), else, for
BFCL, the calls it writes in Python (``f(a=1)``), else nothing. An output is *valid* when the
whole of it is JSON its schema admits.
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

import guidedec.bench.quality.puzzles as puzzles
from guidedec.bench import bfcl
from guidedec.bench.extraction_set import EXTRACTION, FIELDS, Person, instruction, record_schema

_ARTICLES = re.compile(r"^(a|an|the)\s+")


@dataclass(frozen=True)
class Item:
    """One question: its chat, its answer's schema and what the judge needs."""

    id: str
    messages: list[dict[str, Any]]
    schema: dict[str, Any]
    truth: Any


@dataclass(frozen=True)
class Verdict:
    """How one output fared: units right (fields or questions), whether an answer was found,
    whether the whole output is valid."""

    right: int
    found: bool
    valid: bool


@dataclass(frozen=True)
class Task:
    """A named list of items, judged by ``judge(text, item)`` in units of ``units`` per item."""

    name: str
    items: list[Item]
    units: int
    unit: str
    max_tokens: int
    judge: Callable[[str, Item], Verdict]


def whole_or_first(text: str, accept: Callable[[Any], bool]) -> Any:
    """The whole of ``text`` as JSON if it parses, else the first JSON value in it that
    ``accept`` takes; None if there is none."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if accept(value):
            return value
    return None


def first_object(text: str) -> dict[str, Any] | None:
    """The whole of ``text`` or else the first JSON object in it (None: no object)."""
    value = whole_or_first(text, lambda v: isinstance(v, dict))
    return value if isinstance(value, dict) else None


def schema_valid(text: str, schema: dict[str, Any]) -> bool:
    """Whether the whole of ``text`` is JSON that ``schema`` admits."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    except jsonschema.SchemaError:
        return True  # a schema jsonschema cannot read: the output parsed, which is what counts
    return True


# --- extraction -------------------------------------------------------------------------------


def _norm(value: Any) -> str:
    """Lower case, accents folded (``São`` is ``Sao``), inner whitespace single, outer
    punctuation and a leading article gone."""
    folded = unicodedata.normalize("NFKD", str(value))
    text = "".join(ch for ch in folded if not unicodedata.combining(ch))
    text = re.sub(r"\s+", " ", text).strip().strip(".,;:!\"'").lower()
    return _ARTICLES.sub("", text)


def field_right(name: str, got: Any, expected: Any) -> bool:
    """Whether the extracted ``got`` is the fact ``expected`` of field ``name`` (an age may be
    a numeric string; a city may carry its country after a comma)."""
    if name == "age":
        try:
            return int(str(got).strip()) == expected and not isinstance(got, bool)
        except ValueError:
            return False
    got_text, want = _norm(got), _norm(expected)
    if name == "city":
        return got_text == want or got_text.split(",")[0].strip() == want
    return got_text == want


def fields_right(text: str, facts: Person) -> dict[str, bool]:
    """Each field's verdict for one extraction output."""
    record = first_object(text)
    if record is None:
        return dict.fromkeys(FIELDS, False)
    return {
        name: name in record and field_right(name, record[name], facts[name])  # type: ignore[literal-required]
        for name in FIELDS
    }


def _judge_extraction(text: str, item: Item) -> Verdict:
    verdicts = fields_right(text, item.truth)
    found = first_object(text) is not None
    return Verdict(sum(verdicts.values()), found, schema_valid(text, item.schema))


def extraction(limit: int | None = None) -> Task:
    schema = record_schema()
    items = [
        Item(f"extraction-{i}", [{"role": "user", "content": instruction(s)}], schema, facts)
        for i, (s, facts) in enumerate(EXTRACTION[:limit])
    ]
    return Task("extraction", items, len(FIELDS), "fields", 96, _judge_extraction)


# --- BFCL ---------------------------------------------------------------------------------------

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
BFCL_SYSTEM = (
    "You can call these functions, each described as JSON:\n{functions}\n\n"
    "Answer the user's request with the function calls to make, as a JSON array of calls, "
    'each an object {{"name": <function name>, "arguments": {{<argument name>: <value>}}}}.'
)


def calls_schema(question: bfcl.Question) -> dict[str, Any]:
    """A JSON array of one or more calls of the question's functions, each
    ``{"name", "arguments"}`` with the arguments its function takes."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"]["parameters"],
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in bfcl.request_tools(question)
    ]
    items = options[0] if len(options) == 1 else {"anyOf": options}
    return {"type": "array", "items": items, "minItems": 1}


def bfcl_messages(question: bfcl.Question) -> list[dict[str, Any]]:
    """The question's chat, the functions described in its system turn."""
    functions = "\n".join(json.dumps(t["function"]) for t in bfcl.request_tools(question))
    system = BFCL_SYSTEM.format(functions=functions)
    messages = [dict(m) for m in question.messages]
    if messages and messages[0]["role"] == "system":
        system = f"{messages.pop(0)['content']}\n\n{system}"
    return [{"role": "system", "content": system}, *messages]


def calls_in(text: str) -> list[tuple[str, Any]] | None:
    """The calls an output makes: a JSON array of ``{"name", "arguments"}`` objects (of one
    cut short, every call it completed), or one such object (None: neither)."""

    def is_call(v: Any) -> bool:
        return isinstance(v, dict) and "name" in v

    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError:
        value = None
        for match in re.finditer(r"[\[{]", text):
            found = _array_items(text, match.start()) if match.group() == "[" else None
            if found is None:
                found = _one_value(text, match.start())
            if is_call(found) or (isinstance(found, list) and found and all(map(is_call, found))):
                value = found
                break
    if is_call(value):
        value = [value]
    if not (isinstance(value, list) and value and all(map(is_call, value))):
        return None
    return [(str(call["name"]), call.get("arguments", {})) for call in value]


def _one_value(text: str, start: int) -> Any:
    try:
        return json.JSONDecoder().raw_decode(text, start)[0]
    except json.JSONDecodeError:
        return None


def _array_items(text: str, start: int) -> list[Any] | None:
    """The items of the JSON array at ``start``: all of them, or those it completed before it
    was cut short (None: not one)."""
    decoder, items, at = json.JSONDecoder(), [], start + 1
    while True:
        at = len(text) - len(text[at:].lstrip())
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        items.append(value)
        at = len(text) - len(text[at:].lstrip())
        if text[at : at + 1] != ",":
            break
        at += 1
    return items or None


def python_calls(text: str, names: Mapping[str, str]) -> list[tuple[str, Any]] | None:
    """The calls an output writes in Python (``f(a=1)``, ``math.f(2)``: how an unguided small
    model often answers) of the functions in ``names`` (OpenAI name -> the question's own), as
    ``(name, arguments)``; positional arguments take the parameters' order. None: none."""
    known = {own: name for name, own in names.items()} | {name: name for name in names}
    calls = []
    for match in re.finditer(r"[A-Za-z_][\w.]*\(", text):
        name = match.group()[:-1]
        if name not in known:
            continue
        call = _python_call(text, match.start())
        if call is None:
            continue
        args, kwargs = call
        calls.append((known[name], (args, kwargs)))
    return calls or None


def _python_call(text: str, start: int) -> tuple[list[Any], dict[str, Any]] | None:
    """The literal arguments of the call that starts at ``start`` (None: not one)."""
    depth = 0
    for end in range(text.index("(", start), len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            break
    else:
        return None
    try:
        node = ast.parse(text[start : end + 1], mode="eval").body
        assert isinstance(node, ast.Call)
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except (SyntaxError, ValueError, AssertionError, TypeError, MemoryError, RecursionError):
        return None
    return args, kwargs


def _named_arguments(
    calls: list[tuple[str, Any]], question: bfcl.Question
) -> list[tuple[str, Any]]:
    """Python calls' positional arguments named after their function's parameters."""
    tools = {t["function"]["name"]: t["function"] for t in bfcl.request_tools(question)}
    named = []
    for name, (args, kwargs) in calls:
        order = list(tools[name]["parameters"].get("properties", {}))
        named.append((name, {**dict(zip(order, args, strict=False)), **kwargs}))
    return named


def _judge_bfcl(text: str, item: Item) -> Verdict:
    calls = calls_in(text)
    if calls is None:  # an unguided answer in Python
        written = python_calls(text, item.truth.names)
        calls = None if written is None else _named_arguments(written, item.truth)
    right = calls is not None and bfcl.correct(calls, item.truth)
    return Verdict(int(right), calls is not None, schema_valid(text, item.schema))


def bfcl_task(category: str, limit: int | None) -> Task:
    questions = bfcl.load(category, limit)
    items = [Item(q.id, bfcl_messages(q), calls_schema(q), q) for q in questions]
    budget = 128 if category in ("simple_python", "multiple") else 256
    return Task(f"bfcl {category}", items, 1, "questions", budget, _judge_bfcl)


# --- puzzles ------------------------------------------------------------------------------------


def _judge_puzzle(text: str, item: Item) -> Verdict:
    answer = puzzles.answer_in(text, item.truth)
    right = answer is not None and puzzles.same(answer, item.truth)
    return Verdict(int(right), answer is not None, schema_valid(text, item.schema))


def puzzle_task(limit: int | None = None) -> Task:
    items = [
        Item(f"puzzle-{i}", [{"role": "user", "content": p.prompt}], p.schema, p.answer)
        for i, p in enumerate(puzzles.PUZZLES[:limit])
    ]
    return Task("puzzles", items, 1, "questions", 96, _judge_puzzle)


TASKS = ("extraction", *(f"bfcl {c}" for c in BFCL_CATEGORIES), "puzzles")


SIZES = {"extraction": 60, "puzzles": 120}
"""Items per task by default (a BFCL category: ``BFCL_ITEMS``)."""
BFCL_ITEMS = 30


def load_tasks(names: Sequence[str], limit: int | None = None) -> list[Task]:
    """The named tasks, each cut to its first ``limit`` items (None: its default size,
    ``SIZES`` or ``BFCL_ITEMS``)."""
    out = []
    for name in names:
        size = limit or SIZES.get(name, BFCL_ITEMS)
        if name == "extraction":
            out.append(extraction(size))
        elif name == "puzzles":
            out.append(puzzle_task(size))
        else:
            out.append(bfcl_task(name.removeprefix("bfcl "), size))
    return out
