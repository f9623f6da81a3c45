"""Prompt lookup decoding: a model-free drafter for speculative decoding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


class NgramDrafter:
    """Prompt lookup decoding: propose the tokens that followed the most recent earlier
    occurrence of the sequence's last n tokens.

    Args:
        max_ngram: The longest suffix looked up (tried first).
        min_ngram: The shortest suffix looked up (tried last); 1 <= min_ngram <= max_ngram.

    Raises:
        ValueError: if the n-gram bounds are out of range.
    """

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, "
                f"max_ngram={max_ngram}"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, token_ids: Sequence[int], num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` draft tokens to follow ``token_ids`` (prompt + output so far).

        For n from ``max_ngram`` down to ``min_ngram`` (n < len(token_ids)): find the most
        recent occurrence of ``token_ids[-n:]`` that ends before the last token (so not the
        suffix itself, though it may overlap it), and propose the tokens that followed it, at
        most ``num_tokens`` (fewer where the sequence ends). The first n that matches wins;
        no match, or ``num_tokens == 0``, gives []. Deterministic; O(len(token_ids)) per n.

        Raises:
            ValueError: if ``num_tokens`` is negative.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        tokens = np.asarray(token_ids, dtype=np.int64)
        if num_tokens == 0:
            return []
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            end = _most_recent_match(tokens, n)
            if end is not None:
                proposal: list[int] = tokens[end + 1 : end + 1 + num_tokens].tolist()
                return proposal
        return []


def _most_recent_match(tokens: npt.NDArray[np.int64], n: int) -> int | None:
    """The largest index e < len(tokens) - 1 with ``tokens[e - n + 1 : e + 1]`` equal to the last
    n tokens, or None."""
    last = len(tokens) - 1
    # Candidate ends match the last token; filter them by each earlier token of the n-gram.
    ends = np.flatnonzero(tokens[n - 1 : last] == tokens[last]) + (n - 1)
    for back in range(1, n):
        if ends.size == 0:
            return None
        ends = ends[tokens[ends - back] == tokens[last - back]]
    return int(ends[-1]) if ends.size else None
