"""BFCL tool-call questions as OpenAI tool requests, and a checker of the calls that come back.

The data ships in the ``bfcl-eval`` wheel (``pip install --no-deps bfcl-eval``): each question
gives its functions (Python-flavoured JSON schemas: ``dict``, ``float``, ``tuple``, ``any``) and
its ground truth, each argument's acceptable values (``""`` where it may be left out).

The checker follows BFCL's AST check: a call is right when it names the function, gives every
required argument, no argument the function lacks, and each value among the acceptable ones
(strings compared without case, spaces and punctuation; an integer where a float is expected).
``parallel`` questions need every expected call once, in any order, and no other.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

CATEGORIES = ("simple_python", "multiple", "parallel")
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


@dataclass(frozen=True)
class Question:
    id: str
    category: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]  # OpenAI tools (names with '.' written '_')
    answers: list[dict[str, dict[str, list[Any]]]]  # per expected call: {name: {arg: values}}

    @property
    def names(self) -> dict[str, str]:
        """Each tool's OpenAI name to the question's own."""
        return {t["function"]["name"]: t["function"]["x-bfcl-name"] for t in self.tools}


def data_dir() -> Path:
    """The ``data`` folder of the installed ``bfcl-eval`` wheel.

    Raises:
        FileNotFoundError: the wheel is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the BFCL data is not installed: pip install --no-deps bfcl-eval")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load(category: str, limit: int | None = None) -> list[Question]:
    """The first ``limit`` questions of a category (all by default)."""
    folder = data_dir()
    name = f"BFCL_v4_{category}.json"
    rows = _jsonl(folder / name)
    answers = {r["id"]: r["ground_truth"] for r in _jsonl(folder / "possible_answer" / name)}
    out = []
    for row in rows[:limit]:
        tools = [openai_tool(f) for f in row["function"]]
        out.append(Question(row["id"], category, row["question"][0], tools, answers[row["id"]]))
    return out


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def openai_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function as an OpenAI tool: JSON-schema types, and a name OpenAI allows."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", function["name"])
    described = {
        "name": name,
        "description": function.get("description", ""),
        "parameters": json_schema(function.get("parameters", {"type": "object"})),
    }
    return {"type": "function", "function": {**described, "x-bfcl-name": function["name"]}}


def request_tools(question: Question) -> list[dict[str, Any]]:
    """The tools as sent (without the bookkeeping key)."""
    return [
        {
            "type": "function",
            "function": {k: v for k, v in t["function"].items() if k != "x-bfcl-name"},
        }
        for t in question.tools
    ]


def json_schema(node: Any) -> Any:
    """BFCL's Python type names as JSON schema's (``any``: no type)."""
    if isinstance(node, list):
        return [json_schema(x) for x in node]
    if not isinstance(node, Mapping):
        return node
    out = {k: json_schema(v) if k != "properties" else _properties(v) for k, v in node.items()}
    kind = out.get("type")
    if isinstance(kind, str) and kind in _TYPES:
        if _TYPES[kind] is None:
            del out["type"]
        else:
            out["type"] = _TYPES[kind]
    return out


def _properties(node: Any) -> Any:
    if not isinstance(node, Mapping):
        return node
    return {name: json_schema(schema) for name, schema in node.items()}


def valid(calls: Sequence[tuple[str, Any]], question: Question) -> bool:
    """Whether the output is one or more calls, each naming a tool with arguments its schema
    admits."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in question.tools}
    if not calls:
        return False
    for name, arguments in calls:
        if name not in schemas or not isinstance(arguments, dict):
            return False
        try:
            jsonschema.validate(arguments, schemas[name])
        except jsonschema.ValidationError:
            return False
        except jsonschema.SchemaError:
            continue  # a schema jsonschema cannot read: the call parsed, which is what counts
    return True


def correct(calls: Sequence[tuple[str, Any]], question: Question) -> bool:
    """Whether the calls are BFCL's expected ones (see the module's docstring)."""
    names = question.names
    named = [(names.get(name, name), arguments) for name, arguments in calls]
    if len(named) != len(question.answers):
        return False
    left = list(question.answers)
    for name, arguments in named:
        match = next((a for a in left if _call_right(name, arguments, a, question)), None)
        if match is None:
            return False
        left.remove(match)
    return True


def _call_right(
    name: str, arguments: Any, answer: Mapping[str, Mapping[str, list[Any]]], question: Question
) -> bool:
    ((expected, values),) = answer.items()
    if name != expected or not isinstance(arguments, dict):
        return False
    tool = next(t for t in question.tools if t["function"]["x-bfcl-name"] == expected)
    properties = tool["function"]["parameters"].get("properties", {})
    if any(arg not in properties for arg in arguments):
        return False
    for arg, acceptable in values.items():
        if arg not in arguments:
            if "" not in acceptable:
                return False
        elif not any(_same(arguments[arg], v) for v in acceptable if v != ""):
            return False
    return True


def _same(got: Any, expected: Any) -> bool:
    if isinstance(expected, str):
        return isinstance(got, str) and _plain(got) == _plain(expected)
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected
    if isinstance(expected, int | float):
        return isinstance(got, int | float) and float(got) == float(expected)
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_same(g, e) for g, e in zip(got, expected, strict=True))
        )
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return False
        for key, acceptable in expected.items():
            options = acceptable if isinstance(acceptable, list) else [acceptable]
            if key not in got:
                if "" not in options:
                    return False
            elif not any(_same(got[key], o) for o in options if o != ""):
                return False
        return all(key in expected for key in got)
    return bool(got == expected)


def _plain(text: str) -> str:
    return re.sub(r"[ ,./\-_*^'\"]", "", text).lower()
