"""The public data sets of the soundness and instance tests, loaded and sampled with a fixed seed.

Each data set is a list of :class:`Case`: one guide plus its labelled test instances (texts the
guide must accept or reject). Samples are drawn by :func:`sample` with :data:`SEED`, so the same
cases are tested on every run and every backend, and the soundness and instance tests share
compiled grammars. The data lives in ``../shared/data`` (see its ``SOURCES.md``).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from conftest import data_path
from guidedec import GuidedDecodingParams

T = TypeVar("T")
Kind = Literal["json", "regex", "ebnf", "lark"]

SEED = 20240611
JSON_SCHEMA_TEST_SUITE_DRAFT = "draft2020-12"  # the draft with the most test files
JSONSCHEMABENCH_SUBSETS = (
    "Github_easy",
    "Github_trivial",
    "Glaiveai2K",
    "Handwritten",
    "JME",
    "Kubernetes",
    "MCPspec",
    "Synthesized",
)
# Cases per data set, sized so that both test files run in ~3 minutes on 2 CPU cores: with the
# 129k-token vocabulary an xgrammar JSON-schema compile takes ~0.1 s (test suite) to ~1 s
# (a 1 kB jsonschemabench schema), and one generation batch of 32 guides ~3 s.
SAMPLE_SIZES = {"JSON-Schema-Test-Suite": 64, "jsonschemabench": 8, "regex": 32, "lark": 24}
# xgrammar's compile time grows with the schema (~0.7 s per kB; 100 s for the largest Kubernetes
# schemas), so jsonschemabench is sampled among schemas of at most this many characters of
# JSON: all but 16 of Github_easy, 24 of Github_trivial, 2 of Handwritten, 13 of MCPspec and
# 618 of Kubernetes.
MAX_SCHEMA_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Instance:
    """A labelled test instance: ``text`` is a complete output that ``valid`` says is allowed."""

    text: str
    valid: bool
    data: Any = None  # the JSON value of a JSON-schema instance


@dataclass(frozen=True)
class Case:
    """One guide of a data set and its labelled instances."""

    dataset: str
    case_id: str
    kind: Kind
    guide: Any  # the JSON schema (a value), regex, EBNF or Lark text
    instances: tuple[Instance, ...] = ()
    json_root: str | None = None  # a grammar whose outputs are JSON: the root's type

    @cached_property
    def params(self) -> GuidedDecodingParams:
        if self.kind == "json":
            return GuidedDecodingParams(json_schema=json.dumps(self.guide))
        return GuidedDecodingParams(**{self.kind: self.guide})


def sample(items: Sequence[T], size: int, *, seed: int = SEED) -> list[T]:
    """A seeded sample of ``size`` items (all of them if fewer), in their original order."""
    if len(items) <= size:
        return list(items)
    picked = sorted(random.Random(seed).sample(range(len(items)), size))
    return [items[i] for i in picked]


def read_jsonl(path: Path) -> Iterator[Any]:
    """The JSON values of a ``.jsonl`` file, split on ``\\n`` only (raw U+2028 stays in strings)."""
    with path.open(encoding="utf-8", newline="") as f:
        text = f.read()
    for line in text.split("\n"):
        if line.strip():
            yield json.loads(line)


# --- JSON schemas --------------------------------------------------------------------------


def json_instances(tests: Sequence[dict[str, Any]]) -> tuple[Instance, ...]:
    """The tests as JSON text with raw (unescaped) non-ASCII characters, as a model writes them."""
    return tuple(Instance(json_text(t["data"]), bool(t["valid"]), t["data"]) for t in tests)


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def needs_remote_ref(schema: Any) -> bool:
    """Whether the schema depends on a document it does not hold: a ``$ref`` whose part before
    ``#`` is neither empty nor, as a suffix, one of the schema's ``$id``, or a ``$schema`` that
    is not a json-schema.org meta-schema (the test suite's custom vocabularies)."""
    ids = [v for k, v in _walk(schema) if k == "$id" and isinstance(v, str)]
    for key, value in _walk(schema):
        if not isinstance(value, str):
            continue
        if key == "$schema" and "json-schema.org/" not in value:
            return True
        document = value.split("#", 1)[0]
        local = not document or any(i.rstrip("#").endswith(document) for i in ids)
        if key in ("$ref", "$dynamicRef") and not local:
            return True
    return False


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            if key not in ("const", "enum", "default", "examples"):
                yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


@cache
def json_schema_test_suite() -> list[Case]:
    """JSON-Schema-Test-Suite (one draft, ``optional/`` excluded), minus remote-ref schemas."""
    dataset = "JSON-Schema-Test-Suite"
    folder = data_path("json-schema-test-suite", "tests", JSON_SCHEMA_TEST_SUITE_DRAFT)
    cases = []
    for path in sorted(folder.glob("*.json")):
        for i, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            if needs_remote_ref(group["schema"]):
                continue
            instances = json_instances(group["tests"])
            cases.append(Case(dataset, f"{path.stem}/{i}", "json", group["schema"], instances))
    return sample(cases, SAMPLE_SIZES[dataset])


@cache
def jsonschemabench(subset: str) -> list[Case]:
    """A sample of one jsonschemabench subset: schemas up to ``MAX_SCHEMA_CHARS``, without
    remote refs."""
    rows = list(read_jsonl(data_path("jsonschemabench", f"{subset}.jsonl")))
    rows = [
        r
        for r in rows
        if len(json.dumps(r["schema"])) <= MAX_SCHEMA_CHARS and not needs_remote_ref(r["schema"])
    ]
    dataset = f"jsonschemabench/{subset}"
    return [
        Case(
            dataset,
            r["file"].removeprefix(f"{subset}---"),
            "json",
            r["schema"],
            json_instances(r["tests"]),
        )
        for r in sample(rows, SAMPLE_SIZES["jsonschemabench"])
    ]


# --- Grammars and regular expressions ------------------------------------------------------


_GBNF_JSON_ROOTS = {"json": "object", "json_arr": "array"}


@cache
def llama_cpp_gbnf() -> list[Case]:
    """The llama.cpp example grammars (no instances); ``json*.gbnf`` produce JSON."""
    folder = data_path("grammars", "llama.cpp")
    return [
        Case(
            "llama.cpp-gbnf",
            p.stem,
            "ebnf",
            p.read_text(encoding="utf-8"),
            json_root=_GBNF_JSON_ROOTS.get(p.stem),
        )
        for p in sorted(folder.glob("*.gbnf"))
    ]


@cache
def xgrammar_regex() -> list[Case]:
    """Regexes of xgrammar's regex tests, with the strings they assert accepted or rejected."""
    found: dict[str, tuple[str, list[Instance]]] = {}
    for name in ("test_grammar_matcher_regex", "test_regex_converter"):
        for test_name, pattern, instances in _extracted_regex_tests(name):
            _, known = found.setdefault(pattern, (f"{test_name}#{len(found)}", []))
            known.extend(i for i in instances if i not in known)
    cases = [Case("xgrammar-regex", cid, "regex", p, tuple(i)) for p, (cid, i) in found.items()]
    return sample(cases, SAMPLE_SIZES["regex"])


@cache
def llguidance_lark() -> list[Case]:
    """llguidance's Lark tests: grammars that compile, with accepted and rejected strings."""
    cases = []
    for case in _extracted("llguidance", "test_lark")["cases"]:
        if case["kind"] not in ("lark_accept_reject", "lark_compiles"):
            continue
        if not isinstance(case["grammar"], str):  # built at run time by the original test
            continue
        # "FINAL_REJECT:" marks a string whose every token is allowed but which cannot end.
        # Strings built at run time by the original test were not extracted: they are dropped.
        accepted = [s for s in case.get("accept", []) if isinstance(s, str)]
        rejected = [
            s.removeprefix("FINAL_REJECT:") for s in case.get("reject", []) if isinstance(s, str)
        ]
        instances = _labelled(accepted, rejected)
        cases.append(
            Case(
                "llguidance-lark",
                f"{case['fn']}:{case['line']}",
                "lark",
                case["grammar"],
                instances,
            )
        )
    return sample(cases, SAMPLE_SIZES["lark"])


@cache
def xgrammar_lark() -> list[Case]:
    """xgrammar's Lark language tests (grammar, accepted, rejected), where all are literals."""
    cases = []
    for test in _extracted("xgrammar", "test_lark")["tests"]:
        for n, bound in enumerate(_parameter_sets(test)):
            for call in test["calls"]:
                args = _resolve(call["args"], bound) if call["call"] == "_assert_language" else None
                if not (isinstance(args, list) and len(args) == 3 and _all_str(args)):
                    continue
                grammar, accepted, rejected = args
                case_id = f"{test['test']}#{n}:{call['line']}"
                cases.append(
                    Case("xgrammar-lark", case_id, "lark", grammar, _labelled(accepted, rejected))
                )
    return sample(cases, SAMPLE_SIZES["lark"])


def _labelled(accepted: Sequence[str], rejected: Sequence[str]) -> tuple[Instance, ...]:
    return tuple([Instance(s, True) for s in accepted] + [Instance(s, False) for s in rejected])


def _all_str(args: list[Any]) -> bool:
    grammar, accepted, rejected = args
    texts = [grammar, *accepted, *rejected] if isinstance(accepted, list) else [None]
    return isinstance(rejected, list) and all(isinstance(t, str) for t in texts)


def _extracted(project: str, name: str) -> Any:
    path = data_path("grammars", project, "tests-extracted", f"{name}.json")
    return json.loads(path.read_text(encoding="utf-8"))


_UNRESOLVED = object()
_REGEX_BUILDERS = ("from_regex", "_regex_to_ebnf")


def _extracted_regex_tests(name: str) -> Iterator[tuple[str, str, list[Instance]]]:
    """``(test, pattern, instances)`` from an extracted xgrammar test file."""
    for test in _extracted("xgrammar", name)["tests"]:
        for bound in _parameter_sets(test):
            patterns: dict[int, str] = {}  # the line of the building call -> its pattern
            checks: dict[str, list[Instance]] = {}
            for call in test["calls"]:
                if call["call"] in _REGEX_BUILDERS and call["args"]:
                    pattern = _resolve(call["args"][0], bound)
                    if isinstance(pattern, str):
                        patterns[call["line"]] = pattern
                        checks.setdefault(pattern, [])
                elif call["call"] == "_is_grammar_accept_string":
                    _record_check(call, bound, patterns, checks)
            for pattern, instances in checks.items():
                yield test["test"], pattern, instances


def _record_check(
    call: dict[str, Any],
    bound: dict[str, Any],
    patterns: dict[int, str],
    checks: dict[str, list[Instance]],
) -> None:
    source, text = call["args"][0], _resolve(call["args"][1], bound)
    line = source.get("line") if isinstance(source, dict) else None
    expected = call.get("asserted", _resolve(call.get("asserted_equal_to"), bound))
    if line in patterns and isinstance(text, str) and isinstance(expected, bool):
        checks[patterns[line]].append(Instance(text, expected))


def _parameter_sets(test: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every binding of a test's ``parametrize`` argument names (their cartesian product)."""
    tables = []
    for table in test.get("parametrize", []):
        names = table["argnames"]
        rows = []
        for value in table["argvalues"]:
            if isinstance(value, dict) and "$pytest_param" in value:
                value = value["$pytest_param"]
            values = value if len(names) > 1 else [value]
            if not isinstance(values, list) or len(values) != len(names):
                values = [_UNRESOLVED] * len(names)  # a table the extraction could not read
            rows.append(dict(zip(names, values, strict=True)))
        tables.append(rows)
    for combination in itertools.product(*tables):
        yield {k: v for row in combination for k, v in row.items()}


def _resolve(value: Any, bound: dict[str, Any]) -> Any:
    """A literal argument with ``{"$param": name}`` replaced; ``_UNRESOLVED`` where it is not
    a literal (a variable, a call or an f-string of the original test)."""
    if isinstance(value, dict):
        if set(value) == {"$param"}:
            return bound.get(value["$param"], _UNRESOLVED)
        return _UNRESOLVED
    if isinstance(value, list):
        items = [_resolve(v, bound) for v in value]
        return _UNRESOLVED if any(i is _UNRESOLVED for i in items) else items
    return value


# --- The data sets by name -----------------------------------------------------------------


def load(dataset: str) -> list[Case]:
    """The sampled cases of ``dataset`` (a name from :data:`DATASETS`)."""
    if dataset.startswith("jsonschemabench/"):
        return jsonschemabench(dataset.split("/", 1)[1])
    return _LOADERS[dataset]()


_LOADERS = {
    "JSON-Schema-Test-Suite": json_schema_test_suite,
    "llama.cpp-gbnf": llama_cpp_gbnf,
    "xgrammar-regex": xgrammar_regex,
    "llguidance-lark": llguidance_lark,
    "xgrammar-lark": xgrammar_lark,
}


def with_slow_marks(datasets: Sequence[str]) -> list[Any]:
    """``datasets`` as pytest parameters; the JSON-schema ones are marked slow (xgrammar compiles
    ~0.1-1 s per schema)."""
    return [
        pytest.param(name, marks=pytest.mark.slow) if name in JSON_DATASETS else name
        for name in datasets
    ]


JSON_DATASETS = (
    "JSON-Schema-Test-Suite",
    *(f"jsonschemabench/{s}" for s in JSONSCHEMABENCH_SUBSETS),
)
DATASETS = (*JSON_DATASETS, "llama.cpp-gbnf", "xgrammar-regex", "llguidance-lark", "xgrammar-lark")
