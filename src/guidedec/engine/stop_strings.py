"""Stop strings: where a request's output first contains one of its ``stop`` strings.

Checked after every generated token on the decoded tail only (enough tokens to hold the longest
stop string and the new token's text), so a check costs one short decode; the whole output is
decoded once, on a hit, to place the cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from guidedec.tokenizer import TokenizerInfo

TAIL_SLACK = 4
"""Tokens decoded beyond one per character of the longest stop string: a byte-level token can
hold part of a character, so one token is not always one character."""


def stop_string_start(
    tokenizer: TokenizerInfo, token_ids: Sequence[int], stops: Sequence[str]
) -> int | None:
    """The index in ``tokenizer.decode(token_ids)`` where the first stop string found starts,
    if the last token completed one; None otherwise. Earlier tokens were checked when they
    came, so only a stop string that ends in the last token's text is new."""
    longest = max(len(s) for s in stops)
    tail = tokenizer.decode(list(token_ids[-(longest + TAIL_SLACK) :]))
    if not any(s in tail for s in stops):
        return None
    text = tokenizer.decode(list(token_ids))
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None
