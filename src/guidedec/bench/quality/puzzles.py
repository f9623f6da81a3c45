"""A hundred and twenty short questions whose answer is one JSON field (``{"answer": ...}``),
the reasoning task of ``guidedec bench quality``: thirty each of adding two one-digit numbers,
the largest of three two-digit numbers, the first letter of a word and the last letter of a
word. Generated from a fixed seed (the same set every run); each prompt invites the model to
think first, which a guide that starts at the answer's ``{`` does not let it do.

An unguided reply is read fairly: its last JSON object with an ``answer`` key, else the last
integer (number questions) or the last quoted text (letter questions) in it.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

_WORDS = (
    "apple", "river", "planet", "garden", "window", "silver", "pencil", "market", "ocean",
    "bridge", "candle", "forest", "guitar", "helmet", "island", "jacket", "kitten", "lemon",
    "mirror", "needle", "orange", "pillow", "rabbit", "saddle", "tomato", "velvet", "wallet",
    "yellow", "zebra", "basket",
)  # fmt: skip
SUFFIX = ' Think it through briefly, then give the answer as JSON: {"answer": ...}.'


@dataclass(frozen=True)
class Puzzle:
    prompt: str
    answer: int | str

    @property
    def schema(self) -> dict[str, Any]:
        kind = "integer" if isinstance(self.answer, int) else "string"
        return {
            "type": "object",
            "properties": {"answer": {"type": kind}},
            "required": ["answer"],
            "additionalProperties": False,
        }


def _make(seed: int = 0, each: int = 30) -> list[Puzzle]:
    rng = random.Random(seed)
    sums = rng.sample([(a, b) for a in range(1, 10) for b in range(1, 10)], each)
    triples: list[tuple[int, ...]] = []
    while len(triples) < each:
        triple = tuple(rng.sample(range(10, 100), 3))
        if triple not in triples:
            triples.append(triple)
    words = rng.sample(_WORDS, len(_WORDS))
    made: list[Puzzle] = []
    for i in range(each):
        (a, b), (x, y, z) = sums[i], triples[i]
        made.append(Puzzle(f"What is {a} + {b}?{SUFFIX}", a + b))
        made.append(Puzzle(f"Which is the largest of {x}, {y} and {z}?{SUFFIX}", max(x, y, z)))
        first, last = words[i % len(words)], words[-1 - i % len(words)]
        made.append(Puzzle(f"What is the first letter of the word '{first}'?{SUFFIX}", first[0]))
        made.append(Puzzle(f"What is the last letter of the word '{last}'?{SUFFIX}", last[-1]))
    return made


PUZZLES = _make()


def answer_in(text: str, truth: int | str) -> Any:
    """The answer an output gives (None: none found); see the module's docstring."""
    decoder = json.JSONDecoder()
    found = None
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and "answer" in value:
            found = value
    if found is not None:
        return found["answer"]
    if isinstance(truth, int):
        numbers = re.findall(r"-?\d+", text)
        return int(numbers[-1]) if numbers else None
    quoted = re.findall(r"[\"'“‘]([^\"'”’]{1,20})[\"'”’]", text)
    return quoted[-1] if quoted else None


def same(answer: Any, truth: int | str) -> bool:
    """Whether ``answer`` is ``truth`` (a number may come as a numeric string; letters compare
    without case)."""
    if isinstance(answer, bool):
        return False
    if isinstance(truth, int):
        try:
            return int(str(answer).strip()) == truth
        except ValueError:
            return False
    return isinstance(answer, str) and answer.strip().strip(".").lower() == truth.lower()
