"""Steering: a value that would break its JSON schema is not written, where the model has another.

xgrammar enforces some schemas only approximately (``not``, ``if``/``then``, an overlapping
``oneOf``, ``uniqueItems``: :func:`guidedec.grammar.auto_policy.xgrammar_inexact_reason`), so
its grammar lets through values the schema forbids. For such a request the engine checks each
sampled token that holds a JSON structural character: it reads the output so far plus the
token with :func:`guidedec.grammar.json_prefix.scan_prefix` and validates the complete values
against the full schema with ``jsonschema``. An error in a value that is now closed is settled
(nothing later can repair it), so the token is drawn again without it, from the same row.
Errors where the output is still open (a ``required`` key not yet written, an ``oneOf`` over an
object still growing) are left for later; so are errors reached through keywords that read
other parts of the instance (``if``/``then``/``else``, ``dependentSchemas``, ``unevaluated*``),
until the whole output is closed.

When every draw breaks the schema the output cannot be made valid: the engine ends it with
``grammar_error`` at once, naming the keyword and the path. A steered request proposes no draft
tokens (each of its tokens is checked). Outputs that never break the schema are unchanged:
token for token when greedy or without jump-forward; with jump-forward a sampled output keeps
its distribution, not its tokens (an unsteered request's verification draws other uniforms).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from guidedec.decoder.token_checks import TokenChecks
from guidedec.engine.masked_forward import StepRows
from guidedec.engine.request import Request
from guidedec.engine.validation import OutputValidator, describe_error
from guidedec.errors import REQUEST_ERRORS
from guidedec.grammar.auto_policy import XGRAMMAR, xgrammar_inexact_reason
from guidedec.grammar.json_prefix import scan_prefix
from guidedec.grammar.params import GuidedDecodingParams, GuideType
from guidedec.kept import Kept
from guidedec.tokenizer import TokenizerInfo

CONTEXTUAL_KEYWORDS = frozenset(
    {
        "if",
        "then",
        "else",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
    }
)
"""Keywords whose verdict on a value depends on other parts of the instance."""
GUIDES_KEPT = 1024
VERDICTS_KEPT = 1024
"""Verdicts of :meth:`ValueSteering.problem` kept (all are dropped when it fills)."""
MAX_RESAMPLES = 4
"""Draws of one row that closing or steering may refuse before the engine gives up on better."""
NO_FIT = ""
"""The refusal of budget-aware closing: no completion fits after the token."""


@dataclass(slots=True)
class SteeringStats:
    """What steering did, summed over the engine's life."""

    checks: int = 0  # sampled tokens checked
    steered: int = 0  # tokens drawn again because they settled an invalid value
    given_up: int = 0  # outputs ended grammar_error: no draw kept them valid


class ValueSteering:
    """Decides which requests are steered and checks their sampled tokens."""

    def __init__(
        self, validator: OutputValidator, structural: Callable[[], npt.NDArray[np.bool_]]
    ) -> None:
        self.validator = validator
        self._structural = structural  # per token id: whether its text holds {}[],:"
        self._inexact: OrderedDict[object, bool] = OrderedDict()
        # (guide, settled text, open path) -> problem(): the checks of one output repeat it
        self._verdicts: Kept[tuple[object, str, object], str | None] = Kept(VERDICTS_KEPT)
        self.stats = SteeringStats()

    def applies(self, params: GuidedDecodingParams, backend: str) -> bool:
        """Whether the request's tokens are checked: a JSON schema that its matcher's backend
        (xgrammar) enforces only approximately."""
        if params.guide_type is not GuideType.JSON_SCHEMA:
            return False
        if backend != XGRAMMAR:
            return False
        key = params.guide
        known = self._inexact.get(key)
        if known is None:
            assert isinstance(params.guide, str)
            known = xgrammar_inexact_reason(params.guide) is not None
            self._inexact[key] = known
            if len(self._inexact) > GUIDES_KEPT:
                self._inexact.popitem(last=False)
        return known

    def needs_check(self, token: int) -> bool:
        """Whether ``token`` may close a value (it holds a structural character)."""
        structural = self._structural()
        return 0 <= token < structural.shape[0] and bool(structural[token])

    def problem(self, params: GuidedDecodingParams, text: str) -> str | None:
        """Why ``text`` (the output with the candidate token) has settled a value that breaks
        the schema; None when it has not, or when nothing can be judged yet."""
        self.stats.checks += 1
        prefix = scan_prefix(text)
        if prefix.closed is None:
            return None
        key = (params.guide, prefix.closed, prefix.open_path)
        if key in self._verdicts:  # a whitespace or a separator settles nothing new
            return self._verdicts.get(key)
        return self._verdicts.put(key, self._judge(params, prefix.closed, prefix.open_path))

    def _judge(
        self, params: GuidedDecodingParams, closed: str, open_path: tuple[str | int, ...] | None
    ) -> str | None:
        try:
            instance = json.loads(closed)
        except (ValueError, RecursionError):
            return None
        for error in self.validator.errors(params, instance):
            if _settled(error, open_path):
                return describe_error(error)
        return None


def _settled(error: Any, open_path: tuple[str | int, ...] | None) -> bool:
    """Whether ``error`` holds whatever the output goes on to write."""
    if open_path is None:
        return True  # the whole output is closed
    if any(part in CONTEXTUAL_KEYWORDS for part in error.absolute_schema_path):
        return False
    path = tuple(error.absolute_path)
    return open_path[: len(path)] != path  # not the open value or one of its containers


def first_admitted(
    token: int,
    refusal: Callable[[int], str | None],
    redraw: Callable[[list[int]], int | None],
) -> tuple[int, str | None]:
    """The first of ``token`` and its redraws (each without the tokens refused before it) that
    ``refusal`` admits (returns None for), and None; or, after ``MAX_RESAMPLES`` refusals or
    once ``redraw`` has nothing left, the last token tried and its refusal."""
    banned: list[int] = []
    for attempt in range(MAX_RESAMPLES):
        refused = refusal(token)
        if refused is None:
            return token, None
        banned.append(token)
        redrawn = redraw(banned)
        if redrawn is None or attempt == MAX_RESAMPLES - 1:
            return token, refused
        token = redrawn
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class SampledToken:
    """A token sampled for a guided request's last closed row, and what its checks read of the
    request.

    Attributes:
        token: The token drawn.
        params: The request's guide.
        slot: The request's sequence slot in the decoder.
        tokens_left: Tokens the request may still emit, this one included.
        output_ids: The request's output so far (without ``token``).
        closing: The request closes within its budget (budget-aware closing checks the token).
        steered: The request's values are checked against its schema (steering).
    """

    token: int
    params: GuidedDecodingParams
    slot: int
    tokens_left: int
    output_ids: Sequence[int]
    closing: bool
    steered: bool


def check_sampled(
    sampled: SampledToken,
    checks: TokenChecks,
    steering: ValueSteering,
    tokenizer: TokenizerInfo,
    redraw: Callable[[list[int]], int | None],
) -> tuple[int, str | None]:
    """The checks of one sampled token: steering (``sampled.steered``) refuses a token that
    settles an invalid value, budget-aware closing (``sampled.closing``, through the decoder's
    ``checks``) one after which no completion fits what is left; a refused token is drawn again
    without it (``redraw``). Returns the token to emit, and the settled error when no draw kept
    the output valid (the output cannot be made valid)."""
    slot, left, params = sampled.slot, sampled.tokens_left, sampled.params
    closing = sampled.closing and checks.closes(slot, left)
    steers = sampled.steered
    if not closing and not (steers and steering.needs_check(sampled.token)):
        return sampled.token, None  # most tokens: neither check applies (refusal returns None)

    def refusal(candidate: int) -> str | None:
        if steers and candidate not in tokenizer.stop_token_ids and steering.needs_check(candidate):
            text = tokenizer.decode([*sampled.output_ids, candidate])
            problem = steering.problem(params, text)
            if problem is not None:
                steering.stats.steered += 1
                return problem
        if sampled.closing and checks.closes(slot, left):
            return None if checks.admits(slot, params, candidate, left) else NO_FIT
        return None

    token, refused = first_admitted(sampled.token, refusal, redraw)
    if refused is None:
        return token, None
    if refused != NO_FIT:
        steering.stats.given_up += 1
        return token, refused
    fallback = checks.fallback(slot, left)
    return (token if fallback is None else fallback), None


class SampledChecks:
    """The engine's checks of each token it samples for a guided request's last closed row
    (:func:`check_sampled`), with the request's state kept on it (``steered``, ``broken``,
    ``forced_from``).

    Args:
        token_checks: The decoder's side of the checks (its slots' matchers and closer).
        steering: The schema checks of steered requests.
        tokenizer: The model's tokenizer.
        max_model_len: The model's context (a request's budget ends there too).
    """

    def __init__(
        self,
        token_checks: TokenChecks,
        steering: ValueSteering,
        tokenizer: TokenizerInfo,
        max_model_len: int,
    ) -> None:
        self.token_checks, self.steering = token_checks, steering
        self.tokenizer, self.max_model_len = tokenizer, max_model_len

    def check(self, req: Request, row: int, token: int, step: StepRows) -> int | None:
        """``token``, or another one sampled from the same row (``row`` of ``step``) without
        it, when after it no completion of the request's guide fits what is left of its budget
        (budget-aware closing; see :meth:`guidedec.decoder.closing.BudgetCloser.admits`) or it
        closes a value that breaks the request's schema (steering). The draw is the row's
        distribution restricted to the tokens that pass.

        None when a backend call inside the checks failed: the request has finished with
        ``grammar_error`` naming it (its matcher's state is unknown); the others go on."""
        guide, slot = req.params.guided_decoding, req.slot
        if guide is None or slot is None:
            return token
        checks = self.token_checks
        backend = checks.backend(slot)
        if backend is None:
            return token
        if req.steered is None:
            req.steered = self.steering.applies(guide, backend)
        closing, steered = req.params.close_within_budget, req.steered
        if not closing and not steered:
            return token
        left = req.tokens_left(self.max_model_len)
        sampled = SampledToken(token, guide, slot, left, req.output_token_ids, closing, steered)
        try:
            token, broken = check_sampled(
                sampled,
                checks,
                self.steering,
                self.tokenizer,
                lambda banned: step.redraw(row, req.params, req.generator, banned),
            )
        except REQUEST_ERRORS as exc:
            message = f"request {req.request_id} (slot {slot}) failed in guided decoding: {exc}"
            req.finish("grammar_error", message)
            return None
        if broken is not None:  # no draw keeps the output valid
            req.broken = broken
        if closing and req.forced_from is None and checks.forced_at(slot) == left:
            req.forced_from = len(req.output_token_ids)  # the budget chose this token
        return token
