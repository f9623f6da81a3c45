"""Sampling: per-request parameters and the processed distribution (speculative verification is
:mod:`guidedec.engine.verification`).

Logits arrive masked (the GuidedDecoder sets grammar-forbidden tokens to -inf): every function
here gives such a token probability exactly 0 and never returns it."""

from __future__ import annotations

import math
import operator
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import SupportsIndex

import torch

from guidedec.grammar.params import GuidedDecodingParams

_NUCLEUS_CANDIDATES = 1024  # top-p sorts only these when they hold the nucleus


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples.

    Args:
        max_tokens: The most tokens to generate (>= 1).
        temperature: Softmax temperature (finite, >= 0); 0 means greedy (argmax).
        top_p: Nucleus mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens; 0 disables it.
        seed: Seeds the request's own generator; None draws a fresh seed from OS entropy.
        stop_token_ids: Token ids that end the output, in addition to the tokenizer's stop
            tokens (as in vLLM). Any sequence of non-negative ints; kept as a tuple. A guided
            output still ends only where its grammar allows a stop token, so extra stop ids
            there matter only if the grammar lets them through.
        stop: Strings that end the output where it first contains one, the string itself and
            what follows it left out of ``text`` (``token_ids`` keep every generated token, as
            in vLLM); a string or a sequence of non-empty strings. Under a guide the cut is not
            checked against it: such an output carries ``incomplete`` saying so.
        logprobs: Report each generated token's log-probability with this many of its row's
            likeliest tokens (0: the token's alone; None: none), from the masked distribution
            it was drawn from (see :mod:`guidedec.engine.logprobs`). At most 20.
        thinking_token_budget: With a reasoning parser (``LLM(reasoning_parser=...)``): the
            most thinking tokens; the next one is the end-of-thinking token. None: no limit.
        guided_decoding: The guide the output must follow, if any.
        close_within_budget: For a guided request (default True): near the end of its budget
            (``max_tokens`` or the model's context), steer the output to a completion of its
            guide that fits, so that it ends complete and valid rather than cut short (see
            :mod:`guidedec.decoder.closing`). An output that finishes well inside its budget is
            unchanged. False: outputs are cut at the budget, as in other engines.

    Raises:
        ValueError: naming the first parameter that is out of range.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: Sequence[int] | None = None
    stop: str | Sequence[str] | None = None
    logprobs: int | None = None
    thinking_token_budget: int | None = None
    guided_decoding: GuidedDecodingParams | None = None
    close_within_budget: bool = True

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_int("top_k", self.top_k, minimum=0)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=-(2**63))
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature < math.inf):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", _stop_ids(self.stop_token_ids))
        if self.stop is not None:
            object.__setattr__(self, "stop", _stop_strings(self.stop))
        if self.thinking_token_budget is not None:
            _check_int("thinking_token_budget", self.thinking_token_budget, minimum=0)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, minimum=0)
            if self.logprobs > MAX_LOGPROBS:
                raise ValueError(f"logprobs must be at most {MAX_LOGPROBS}, got {self.logprobs}")

    @property
    def is_greedy(self) -> bool:
        """True when ``temperature == 0``: every token is the argmax."""
        return self.temperature == 0


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _stop_ids(ids: object) -> tuple[int, ...]:
    if isinstance(ids, Sequence) and not isinstance(ids, (str, bytes)):
        tokens = [_token_id(token) for token in ids]
        if all(token >= 0 for token in tokens):
            return tuple(tokens)
    raise ValueError(f"stop_token_ids must be a sequence of non-negative ints, got {ids!r}")


MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 1024


def _stop_strings(stop: object) -> tuple[str, ...]:
    strings = (stop,) if isinstance(stop, str) else stop
    if not (isinstance(strings, Sequence) and all(isinstance(s, str) and s for s in strings)):
        raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
    if len(strings) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in strings):
        raise ValueError(
            f"stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} "
            "characters each"
        )
    return tuple(strings)


def _token_id(token: object) -> int:
    """``token`` as an int; -1 when it is no integer (a bool is none either)."""
    if isinstance(token, bool) or not isinstance(token, SupportsIndex):
        return -1
    return operator.index(token)


def make_generator(
    params: SamplingParams, device: str | torch.device = "cpu"
) -> torch.Generator | None:
    """The request's own RNG on ``device``: seeded with ``params.seed`` when given, else with 64
    fresh bits of OS entropy. None for greedy requests, which draw nothing."""
    if params.is_greedy:
        return None
    seed = params.seed if params.seed is not None else secrets.randbits(64)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**64)
    return generator


def make_draft_generator(
    params: SamplingParams, device: str | torch.device = "cpu"
) -> torch.Generator | None:
    """A second RNG for a draft model's samples, derived from ``params.seed`` when given, so a
    seeded request repeats its drafts (and so its output) whatever else the engine runs."""
    if params.seed is None:
        return make_generator(params, device)
    return make_generator(replace(params, seed=(params.seed * _DRAFT_SEED_MIX + 1) % 2**64), device)


_DRAFT_SEED_MIX = 0x9E3779B97F4A7C15  # any odd constant: keeps derived seeds distinct


def _check_shape(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or not logits.is_floating_point() or logits.shape[1] == 0:
        shape = tuple(logits.shape)
        raise ValueError(f"logits must be a float tensor [n, V >= 1], got {logits.dtype} {shape}")


def _as_float(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def checked_logits(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` as float32/float64, checked: 2-D float [n, V] with V >= 1, no NaN or +inf,
    and an allowed (not -inf) token in every row; ValueError otherwise."""
    _check_shape(logits)
    x = _as_float(logits)
    if x.shape[0] == 0:
        return x
    if not bool((x < math.inf).all()):
        raise ValueError("logits contain NaN or +inf")
    dead = (x.amax(dim=-1) == -math.inf).nonzero().flatten().tolist()
    if dead:
        raise ValueError(f"logits rows {dead} have no allowed token (every logit is -inf)")
    return x


def _check_peak(peak: float, row: int) -> None:
    """A row's largest logit (``amax``, which propagates NaN) must be finite."""
    if peak == -math.inf:
        raise ValueError(f"logits row {row} has no allowed token (every logit is -inf)")
    if not math.isfinite(peak):
        raise ValueError(f"logits row {row} contains NaN or +inf")


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution each row is sampled from under ``params``, as probabilities [n, V].

    ``softmax(logits / temperature)``; then top-k: keep the tokens whose probability is at least
    the k-th largest (ties at the boundary are all kept); then top-p on the renormalised result:
    keep the smallest set of most likely tokens whose mass is >= ``top_p`` (at least one token;
    tokens tied with its least likely member are kept too); renormalised so each row sums to 1.
    Tokens at -inf get exactly 0. Greedy: one-hot at ``torch.argmax`` (ties: lowest id).
    float32 and float64 logits give probabilities of the same dtype (others give float32).
    ``logits`` is not modified.

    Raises:
        ValueError: ``logits`` is not 2-D float, holds NaN or +inf, or has a row all at -inf.
    """
    return processed_rows(checked_logits(logits), params)


def processed_rows(
    x: torch.Tensor, params: SamplingParams, peak: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`processed_probs` of already checked logits; ``peak`` is their row max [n, 1]
    when the caller has it."""
    if params.is_greedy:
        return torch.zeros_like(x).scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
    if peak is None:
        peak = x.amax(dim=-1, keepdim=True)
    # Subtracting the row max first keeps a tiny temperature from overflowing to inf / inf.
    probs = torch.softmax((x - peak) / params.temperature, dim=-1)
    if 0 < params.top_k < x.shape[-1]:
        kth = probs.topk(params.top_k, dim=-1).values[:, -1:]
        probs = _keep(probs, probs >= kth)
    if params.top_p < 1:
        probs = _keep(probs, probs >= _nucleus_threshold(probs, params.top_p))
    return probs


def _keep(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``probs`` zeroed outside ``keep`` (and wherever it is 0 already), rows renormalised."""
    kept = torch.where(keep & (probs > 0), probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _nucleus_threshold(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Per row [n, 1], the least probability in the smallest most-likely set reaching ``top_p``.
    Sorts just the top ``_NUCLEUS_CANDIDATES`` when they reach it in every row (same sums)."""
    top = probs.topk(min(_NUCLEUS_CANDIDATES, probs.shape[-1]), dim=-1).values
    cumulative = top.cumsum(dim=-1)
    if not bool((cumulative[:, -1] >= top_p).all()):
        top = probs.sort(dim=-1, descending=True).values
        cumulative = top.cumsum(dim=-1)
    mass_before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=-1)
    return torch.where(mass_before < top_p, top, math.inf).amin(dim=-1, keepdim=True)


def draw_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from the 1-D distribution ``probs`` (not necessarily normalised) by inverse CDF
    with one float64 uniform; never a zero-probability token. ValueError if it has no mass."""
    cdf = probs.double().cumsum(dim=0)
    total = float(cdf[-1])
    if not 0 < total < math.inf:
        raise ValueError(f"cannot sample from a distribution with total mass {total}")
    u = uniform(generator)
    target = torch.tensor([u * total], dtype=torch.float64, device=cdf.device)
    index = int(torch.searchsorted(cdf, target, right=True).clamp_(max=probs.numel() - 1))
    if probs[index] > 0:
        return index
    # Rounding hit a zero-probability token: take the last allowed one before it (or the first).
    support = probs.nonzero().flatten()
    position = int((support <= index).sum()) - 1
    return int(support[max(position, 0)])


def uniform(generator: torch.Generator) -> float:
    return float(torch.rand(1, generator=generator, dtype=torch.float64, device=generator.device))


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    *,
    rows: Sequence[int] | None = None,
    allowed: Mapping[int, torch.Tensor] | None = None,
) -> list[int]:
    """One token per row of ``logits`` [n, V] (or per row index of ``rows``, in that order):
    the i-th uses ``params[i]`` and ``generators[i]``.

    Greedy rows take ``torch.argmax`` (ties: lowest id) and need no generator; the others draw
    one token from :func:`processed_probs` with their generator, consuming exactly one float64
    uniform from it. Each row is read in place (no copy of the batch) and checked by the row
    max its processing needs anyway; the draws go row by row, which keeps the working set of a
    row (a few full-vocabulary vectors) in cache: batched over 32 rows of 129,280 tokens the
    same work ran 2x slower here, in page faults of its large temporaries.

    ``allowed`` maps a row to its allowed token ids (ascending; see
    :func:`guidedec.bitmask.sparse_allowed_tokens`) where the row was left unmasked: the row is
    processed over those logits alone, which is the distribution of the masked row (forbidden
    tokens have probability 0 either way) up to float rounding in its normalisation, in work
    proportional to the allowed tokens.

    Raises:
        ValueError: lengths differ, a sampling row has no generator, or a row has every logit
            at -inf (or a NaN / +inf).
    """
    _check_shape(logits)
    indices = range(logits.shape[0]) if rows is None else rows
    if not len(params) == len(generators) == len(indices):
        raise ValueError(f"{len(indices)} rows, {len(params)} params, {len(generators)} generators")
    allowed = allowed or {}
    tokens = []
    for i, (row, row_params, generator) in enumerate(zip(indices, params, generators, strict=True)):
        if not 0 <= row < logits.shape[0]:
            raise ValueError(f"row {row} is outside the {logits.shape[0]} rows of logits")
        ids = allowed.get(row)
        if ids is not None and ids.numel() == 0:
            raise ValueError(f"logits row {row} has no allowed token (an empty allowed set)")
        x = _as_float(logits[row : row + 1] if ids is None else logits[row, ids].unsqueeze(0))
        peak = x.amax(dim=-1, keepdim=True)
        _check_peak(float(peak), row)
        if row_params.is_greedy:
            index = int(x.argmax())
        elif generator is None:
            raise ValueError(f"row {i} samples (temperature > 0) but has no generator")
        else:
            index = draw_token(processed_rows(x, row_params, peak)[0], generator)
        tokens.append(index if ids is None else int(ids[index]))
    return tokens


def greedy_tokens(logits: torch.Tensor) -> list[int | None]:
    """Per row of ``logits`` [n, V], the greedy token (``torch.max``: ties take the lowest id),
    or None where the row's largest logit is not finite: a NaN, a +inf, or every logit at -inf.

    One pass over the rows, which both picks and checks: ``max`` propagates NaN, so a finite
    maximum means the row holds no NaN or +inf and allows a token.
    """
    _check_shape(logits)
    if logits.shape[0] == 0:
        return []
    values, indices = logits.max(dim=-1)
    return [
        token if math.isfinite(value) else None
        for value, token in zip(values.tolist(), indices.tolist(), strict=True)
    ]


def greedy_token(best: Sequence[int | None], row: int) -> int:
    """``best[row]`` from :func:`greedy_tokens`; ValueError naming the row if it is None."""
    token = best[row]
    if token is None:
        raise ValueError(
            f"logits row {row} has no allowed token (every logit is -inf) or a NaN / +inf"
        )
    return token
