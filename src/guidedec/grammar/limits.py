"""Limits on a guide's size and shape, checked in linear time before any backend sees it.

A backend can crash, hang or take gigabytes on a guide far larger than any real one (20,000
required names, 30,000 nested groups in a pattern, a 3,000-link ``$ref`` chain, 100,000
choices); guidedec's own conversions are cheaper to protect than to make immune. Each limit has
a default well above what the shared JSONSchemaBench data and grammars hold (their largest,
in brackets):

- ``max_guide_bytes`` 4 MiB (938 KB, a Kubernetes schema);
- ``max_depth`` 256 levels of JSON nesting in a schema (62);
- ``max_names`` 4,096 entries in one ``properties`` or ``required`` (587);
- ``max_values`` 16,384 values in one ``enum`` or choice list (463);
- ``max_pattern_chars`` 16,384 characters in one pattern or regex (228), and
  ``max_group_depth`` 128 nested groups in it (4);
- ``max_ref_chain`` 512 ``$ref`` links followed from one reference (the data's longest chain
  is far below its 600 definitions);
- ``max_rules`` 2,000 rules in an EBNF or Lark grammar (82); the conversions take ~0.1 s
  per 1,000 rules of Python time.

Also refused: a negative ``minLength``, ``maxLength``, ``minItems``, ``maxItems``,
``minProperties`` or ``maxProperties`` (xgrammar takes ``maxLength: -1``); an external ``$ref``
(one that names no ``$id`` of the schema: xgrammar would read it as "any JSON"); a local
``$ref`` that points nowhere or only to itself; and integer bounds outside the signed 64-bit
range, which the backends cannot enforce (llguidance generates 9223372036854775807 for a
minimum of 2**63).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, fields
from typing import Any

from guidedec.errors import GrammarError
from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.grammar.schema_walk import resolve_ref

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w.-]*(\.\d+)?\s*(::=|:)", re.MULTILINE)


@dataclass(frozen=True)
class GuideLimits:
    """The limits of the module's docstring; each a count, a length or bytes."""

    max_guide_bytes: int = 4 << 20
    max_depth: int = 256
    max_names: int = 4096
    max_values: int = 16384
    max_pattern_chars: int = 16384
    max_group_depth: int = 128
    max_ref_chain: int = 512
    max_rules: int = 2000

    def check(self, params: GuidedDecodingParams) -> None:
        """Raise :class:`GrammarError` naming the first limit ``params`` passes."""
        kind, guide = params.guide_type, params.guide
        if kind is GuideType.CHOICE:
            assert isinstance(guide, tuple)
            self._at_most(len(guide), self.max_values, "choices", "max_values")
            self._at_most(sum(len(c) for c in guide), self.max_guide_bytes, "bytes of choices")
            return
        if guide is None:
            return
        assert isinstance(guide, str)
        self._at_most(len(guide.encode("utf-8", "surrogatepass")), self.max_guide_bytes, "bytes")
        if kind is GuideType.REGEX:
            self._pattern(guide, "the regex")
        elif kind in (GuideType.EBNF, GuideType.LARK):
            rules = len(_RULE.findall(guide))
            self._at_most(rules, self.max_rules, f"rules in the {kind.value} grammar", "max_rules")
        elif kind is GuideType.JSON_SCHEMA:
            try:
                schema = json.loads(guide)
            except (ValueError, RecursionError):
                return  # not JSON: the backend names the problem
            self._schema(schema)

    def _at_most(self, value: int, limit: int, what: str, name: str = "max_guide_bytes") -> None:
        if value > limit:
            raise GrammarError(
                f"the guide has {value} {what}, more than the limit of {limit} (GuideLimits.{name})"
            )

    def _pattern(self, pattern: str, where: str) -> None:
        if len(pattern) > self.max_pattern_chars:
            raise GrammarError(
                f"{where} has {len(pattern)} characters, more than the limit of "
                f"{self.max_pattern_chars} (GuideLimits.max_pattern_chars)"
            )
        depth = deepest = 0
        escaped = False
        for ch in pattern:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == "(":
                depth += 1
                deepest = max(deepest, depth)
            elif ch == ")":
                depth = max(0, depth - 1)
        if deepest > self.max_group_depth:
            raise GrammarError(
                f"{where} nests {deepest} groups, more than the limit of {self.max_group_depth} "
                "(GuideLimits.max_group_depth)"
            )

    def _schema(self, root: Any) -> None:
        """One iterative pass over every value of the schema."""
        chains: dict[str, int] = {}  # local $ref -> links followed from it
        ids = _embedded_ids(root)
        stack: list[tuple[Any, int, str]] = [(root, 0, "")]
        while stack:
            node, depth, path = stack.pop()
            if depth > self.max_depth:
                raise GrammarError(
                    f"the schema nests deeper than {self.max_depth} levels at {path or '/'} "
                    "(GuideLimits.max_depth)"
                )
            if isinstance(node, list):
                stack.extend((v, depth + 1, f"{path}/{i}") for i, v in enumerate(node))
                continue
            if not isinstance(node, dict):
                continue
            self._node(node, root, path, chains, ids)
            for key, value in node.items():
                if key in ("enum", "const", "default", "examples"):
                    continue  # data, not schema: checked by _node
                stack.append((value, depth + 1, f"{path}/{key}"))

    def _node(
        self, node: dict[str, Any], root: Any, path: str, chains: dict[str, int], ids: set[str]
    ) -> None:
        where = path or "/"
        for key in ("properties", "required"):
            names = node.get(key)
            if isinstance(names, dict | list) and len(names) > self.max_names:
                raise GrammarError(
                    f"{where} has {len(names)} {key} names, more than the limit of "
                    f"{self.max_names} (GuideLimits.max_names)"
                )
        values = node.get("enum")
        if isinstance(values, list) and len(values) > self.max_values:
            raise GrammarError(
                f"{where} has an enum of {len(values)} values, more than the limit of "
                f"{self.max_values} (GuideLimits.max_values)"
            )
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            self._pattern(pattern, f"the pattern at {where}")
        names = node.get("patternProperties")
        if isinstance(names, dict):
            for name in names:
                self._pattern(name, f"a patternProperties pattern at {where}")
        ref = node.get("$ref")
        if isinstance(ref, str):
            self._ref_chain(ref, root, where, chains, ids)
        if _is_integer(node):
            for key in _BOUNDS:
                _check_int64(node.get(key), f"{path}/{key}")
        for key in _COUNTS:
            count = node.get(key)
            if isinstance(count, int | float) and not isinstance(count, bool) and count < 0:
                raise GrammarError(f"{key} at {where} is {count}: it must not be negative")

    def _ref_chain(
        self, ref: str, root: Any, where: str, chains: dict[str, int], ids: set[str]
    ) -> None:
        """An external ``$ref`` is refused; a local one is followed through the ``$ref`` s it
        reaches (each chain once: ``chains`` keeps the links counted from every reference)."""
        walked: list[str] = []
        link: str | None = ref
        while link is not None and link not in chains:
            if not link.startswith("#"):
                if not _names_embedded(link, ids):
                    raise GrammarError(
                        f"the $ref {link!r} (from {where}) is external: guidedec resolves only "
                        "references inside the schema (#..., or an $id the schema holds)"
                    )
                break  # to an embedded $id: left to the backends
            if not (link == "#" or link.startswith("#/")):
                break  # an anchor: left to the backends
            if link in walked:
                raise GrammarError(f"the $ref {link!r} (from {where}) refers to itself")
            target = resolve_ref(link, root)
            if target is None:
                if _has_nested_id(root):
                    break  # "#" may mean an embedded schema's own root: left to the backends
                raise GrammarError(f"the $ref {link!r} (from {where}) points to nothing")
            walked.append(link)
            if len(walked) > self.max_ref_chain:
                break
            nested = target.get("$ref") if isinstance(target, dict) else None
            link = nested if isinstance(nested, str) else None
        known = chains.get(link, 0) if link is not None else 0
        for i, name in enumerate(reversed(walked)):
            chains[name] = known + i + 1
        if chains.get(ref, 0) > self.max_ref_chain:
            raise GrammarError(
                f"the $ref chain from {where} is longer than {self.max_ref_chain} links "
                "(GuideLimits.max_ref_chain)"
            )


UNLIMITED = GuideLimits(**{f.name: sys.maxsize for f in fields(GuideLimits)})
"""Limits that never refuse (what a compile worker gets: its caller has checked)."""


def _embedded_ids(root: Any) -> set[str]:
    """Every ``$id`` (and draft-4 ``id``) string in the schema, without its fragment."""
    ids: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("$id", "id"):
                value = node.get(key)
                if isinstance(value, str):
                    ids.add(value.split("#")[0])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return ids


def _has_nested_id(root: Any) -> bool:
    """Whether a schema below the root declares its own ``$id`` (a new base for ``#``)."""
    if not isinstance(root, dict):
        return False
    return bool(_embedded_ids({k: v for k, v in root.items() if k not in ("$id", "id")}))


def _names_embedded(ref: str, ids: set[str]) -> bool:
    """Whether a non-local ``$ref`` may name a schema embedded under an ``$id`` (compared by
    their last path segments: resolving base URIs exactly is the backends' work)."""
    target = ref.split("#")[0].rstrip("/").rsplit("/", 1)[-1]
    return any(i.rstrip("/").rsplit("/", 1)[-1] == target for i in ids if i)


def _is_integer(node: dict[str, Any]) -> bool:
    declared = node.get("type")
    return declared == "integer" or (isinstance(declared, list) and "integer" in declared)


def _check_int64(bound: Any, where: str) -> None:
    if not isinstance(bound, int | float) or isinstance(bound, bool):
        return
    if isinstance(bound, float) and not math.isfinite(bound):
        raise GrammarError(f"the integer bound at {where} is {bound}: not a number")
    if not INT64_MIN <= bound <= INT64_MAX:
        raise GrammarError(
            f"the integer bound {bound} at {where} is outside the signed 64-bit range "
            "that the backends enforce"
        )
