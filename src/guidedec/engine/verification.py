"""Speculative verification: greedy (drafts accepted while they are the target's argmax) and
rejection sampling (every output token distributed exactly as the target's processed
distribution), over masked logits or processed rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from guidedec.engine.sampling import (
    SamplingParams,
    checked_logits,
    draw_token,
    greedy_token,
    processed_rows,
    uniform,
)


def verify_greedy_tokens(best: Sequence[int | None], drafts: Sequence[int]) -> tuple[int, int]:
    """:func:`verify_greedy` from the rows' greedy tokens (:func:`greedy_tokens` of the
    ``len(drafts) + 1`` target rows); a row that is read and is None raises ValueError."""
    if len(best) != len(drafts) + 1:
        raise ValueError(f"need len(drafts) + 1 = {len(drafts) + 1} rows, got {len(best)}")
    num_accepted = 0
    while num_accepted < len(drafts) and greedy_token(best, num_accepted) == drafts[num_accepted]:
        num_accepted += 1
    return num_accepted, greedy_token(best, num_accepted)


def verify_greedy(target_logits: torch.Tensor, drafts: Sequence[int]) -> tuple[int, int]:
    """Greedy verification of ``drafts`` against ``target_logits`` [len(drafts) + 1, V].

    Row i holds the target's masked logits after the accepted prefix plus ``drafts[:i]``.
    Returns ``(num_accepted, next_token)``: drafts are accepted while ``argmax(row i) ==
    drafts[i]``; ``next_token`` is the argmax of the first row that does not match, or of the last
    row (the bonus token) when all match. Rows after that one are not read.

    Raises:
        ValueError: wrong row count, or a row that is read has every logit at -inf.
    """
    if target_logits.dim() != 2 or target_logits.shape[0] != len(drafts) + 1:
        shape = tuple(target_logits.shape)
        raise ValueError(f"target_logits must have len(drafts) + 1 rows, got {shape}")
    best = target_logits.argmax(dim=-1).tolist()
    num_accepted = 0
    while num_accepted < len(drafts) and best[num_accepted] == drafts[num_accepted]:
        num_accepted += 1
    checked_logits(target_logits[: num_accepted + 1])
    return num_accepted, best[num_accepted]


class TargetRows:
    """The target's processed distributions over a verification chunk, row by row, computed
    when first read: ``logits`` [k + 1, V] under ``params`` (see :func:`processed_probs`). A row
    in ``point_masses`` (row -> token) is a point mass at its token, and its logits are never
    read: its mask allows that one token (text the grammar forces), so processing its row
    would give exactly 1 there and 0 elsewhere. A rejection that stops at the first row reads
    no other row. :meth:`of_probs` wraps distributions computed already."""

    def __init__(
        self,
        logits: torch.Tensor,
        params: SamplingParams | None = None,
        point_masses: Mapping[int, int] | None = None,
    ) -> None:
        if logits.dim() != 2:
            raise ValueError(f"target rows must be 2-D, got {tuple(logits.shape)}")
        self.num_rows, self.vocab_size = logits.shape
        self._logits, self._params = logits, params
        self._point_masses = dict(point_masses or {})
        self._rows: dict[int, torch.Tensor] = {}

    @classmethod
    def of_probs(cls, probs: torch.Tensor) -> TargetRows:
        """Rows given as probabilities [k + 1, V] (not necessarily normalised)."""
        target = cls(probs)
        target._rows = dict(enumerate(probs))
        return target

    def probs(self, i: int) -> torch.Tensor:
        """Row ``i``'s distribution [V] (not a point mass's: those are never processed)."""
        row = self._rows.get(i)
        if row is None:
            assert self._params is not None  # of_probs holds every row already
            row = self._rows[i] = processed_rows(
                checked_logits(self._logits[i : i + 1]), self._params
            )[0]
        return row

    def prob(self, i: int, token: int) -> float:
        """Row ``i``'s probability of ``token``."""
        point = self._point_masses.get(i)
        if point is not None:
            return 1.0 if token == point else 0.0
        return float(self.probs(i)[token])

    def draw(
        self,
        i: int,
        generator: torch.Generator,
        *,
        q: torch.Tensor | None = None,
        draft: int | None = None,
    ) -> int:
        """One token from row ``i`` (with ``draft``: from the residual ``max(0, p - q)``, q None
        meaning one-hot at ``draft``), consuming one uniform. A point mass gives its token either
        way (the residual of a point mass is that point mass, or empty, which falls back to it)."""
        point = self._point_masses.get(i)
        if point is not None:
            uniform(generator)  # what the draw from the one-hot row consumes
            return point
        p = self.probs(i)
        return draw_token(p if draft is None else _residual(p, q, draft), generator)


def verify_rejection(
    target_probs: torch.Tensor | TargetRows,
    draft_probs: torch.Tensor | None,
    drafts: Sequence[int],
    generator: torch.Generator,
) -> tuple[int, int]:
    """Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    ``target_probs`` [k + 1, V] (or :class:`TargetRows`, which computes rows as they are read):
    row i is the target's processed distribution p_i after the accepted prefix plus
    ``drafts[:i]``. ``draft_probs`` [k, V]: the distribution q_i each draft was drawn from; None
    for a deterministic drafter (q_i one-hot at ``drafts[i]``).
    For i in order, draft d_i is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``
    (rejected outright when ``q_i(d_i) == 0``). At the first rejection the next token is drawn
    from ``normalize(max(0, p_i - q_i))`` (from p_i when that is all zero) and verification stops;
    when all k are accepted the bonus token is drawn from p_k. Every output token is then
    distributed exactly as the target's p. Returns ``(num_accepted, next_token)``.

    Raises:
        ValueError: shapes that do not match ``drafts``, or a draft id outside [0, V).
    """
    target = (
        target_probs if isinstance(target_probs, TargetRows) else TargetRows.of_probs(target_probs)
    )
    _check_rejection_inputs(target, draft_probs, drafts)
    for i, draft in enumerate(drafts):
        p = target.prob(i, draft)
        q = 1.0 if draft_probs is None else float(draft_probs[i, draft])
        if not (q > 0 and uniform(generator) < p / q):
            q_row = None if draft_probs is None else draft_probs[i]
            return i, target.draw(i, generator, q=q_row, draft=draft)
    return len(drafts), target.draw(len(drafts), generator)


def _residual(p: torch.Tensor, q: torch.Tensor | None, draft: int) -> torch.Tensor:
    """``max(0, p - q)`` (q None: one-hot at ``draft``), or ``p`` when that has no mass."""
    if q is None:
        residual = p.clone()
        residual[draft] = 0.0
    else:
        residual = (p - q.to(p.dtype)).clamp_(min=0.0)
    return residual if bool((residual > 0).any()) else p


def _check_rejection_inputs(
    target: TargetRows, draft_probs: torch.Tensor | None, drafts: Sequence[int]
) -> None:
    k, vocab = len(drafts), target.vocab_size
    if target.num_rows != k + 1:
        raise ValueError(f"target_probs must be [{k + 1}, V], got {(target.num_rows, vocab)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (k, vocab):
        raise ValueError(f"draft_probs must be [{k}, {vocab}], got {tuple(draft_probs.shape)}")
    bad = [d for d in drafts if not 0 <= d < vocab]
    if bad:
        raise ValueError(f"draft tokens {bad} are outside the vocabulary [0, {vocab})")
