"""Drafters for speculative decoding: prompt lookup (n-gram) and a draft model.

Both leave each running request's ``draft_tokens`` ready for the next step and keep the guided
decoder's matchers at the accepted prefix. The draft model's logits are masked by the grammar
at every draft step (``GuidedDecoder.execute_draft_batch``), so its proposals are valid.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from guidedec.decoder import GuidedDecoder, RequestError
from guidedec.engine.batched_runner import BatchedModelRunner
from guidedec.engine.model import LoadedModel
from guidedec.engine.ngram import NgramDrafter
from guidedec.engine.request import Request
from guidedec.engine.runner import ForwardInput
from guidedec.engine.sampling import processed_probs, sample
from guidedec.engine.scheduler import Scheduled

Failure = tuple[int, str]
DRAFT_PREFIX = "draft:"


def draft_budget(
    request: Request,
    num_draft_tokens: int,
    max_model_len: int,
    decoder: GuidedDecoder | None = None,
) -> int:
    """Draft tokens worth proposing: never past ``max_tokens`` or the model's context, and none
    where budget-aware closing may act on the coming rows (see
    :meth:`guidedec.decoder.token_checks.TokenChecks.acts_within`), none for a request whose
    tokens are checked against its schema (see :mod:`guidedec.engine.steering`), and none
    while a reasoning model thinks (see :mod:`guidedec.engine.reasoning`)."""
    params = request.params
    if params.guided_decoding is not None and request.steered is not False:
        return 0
    if request.thinking or request.guide_starts:  # no draft may cross the end of thinking
        return 0
    if (
        decoder is not None
        and request.slot is not None
        and params.guided_decoding is not None
        and params.close_within_budget
        and decoder.token_checks.acts_within(
            request.slot, request.tokens_left(max_model_len), num_draft_tokens
        )
    ):
        return 0
    left = request.params.max_tokens - len(request.output_token_ids) - 1
    room = max_model_len - len(request.all_token_ids) - 1
    return max(0, min(num_draft_tokens, left, room))


def wants_drafts(s: Scheduled) -> bool:
    """Whether the request goes on generating next step (a draft is worth proposing)."""
    req = s.request
    return not req.is_finished and not req.in_prefill and req.slot is not None


class NgramSpeculator:
    """Prompt lookup: no model; the decoder rolls back right after verification."""

    def __init__(self, num_draft_tokens: int, max_model_len: int) -> None:
        self.num_draft_tokens, self.max_model_len = num_draft_tokens, max_model_len
        self.drafter = NgramDrafter()

    def propose(self, batch: Sequence[Scheduled], decoder: GuidedDecoder | None) -> list[Failure]:
        failures: list[Failure] = []
        if decoder is not None:
            counts = [1 + s.request.num_accepted_drafts for s in batch]
            failures = decoder.rollback_rejected_batch(counts)
        for s in batch:
            req = s.request
            k = draft_budget(req, self.num_draft_tokens, self.max_model_len, decoder)
            req.draft_tokens = self.drafter.propose(req.all_token_ids, k) if wants_drafts(s) else []
            req.draft_probs = None
        return failures

    def free(self, slot: int) -> None:
        """Nothing is kept per slot."""


class JumpForwardSpeculator:
    """Jump-forward as drafts: the tokens a guided request's grammar forces next (its keys, its
    ``":"``, the rest of an enum value) are proposed as draft tokens and verified by the target
    in the same forward as the new token, so greedy outputs stay exactly greedy and sampled ones
    keep the target's distribution (see :meth:`GuidedDecoder.forced_tokens`). With
    ``ngram=True`` the n-gram drafter proposes after the forced tokens, up to the budget."""

    def __init__(self, num_draft_tokens: int, max_model_len: int, *, ngram: bool = False) -> None:
        self.num_draft_tokens, self.max_model_len = num_draft_tokens, max_model_len
        self.drafter = NgramDrafter() if ngram else None
        self.proposed = 0  # forced tokens proposed
        self.accepted = 0  # of them, accepted by verification
        self._forced: dict[int, int] = {}  # slot -> forced tokens of its last proposal

    def propose(self, batch: Sequence[Scheduled], decoder: GuidedDecoder | None) -> list[Failure]:
        failures: list[Failure] = []
        if decoder is not None:
            counts = [1 + s.request.num_accepted_drafts for s in batch]
            failures = decoder.rollback_rejected_batch(counts)
        failed = {request_id for request_id, _ in failures}
        for s in batch:
            req = s.request
            if req.slot is not None:
                forced_before = self._forced.pop(req.slot, 0)
                self.accepted += min(forced_before, req.num_accepted_drafts)
            req.draft_tokens, req.draft_probs = [], None
            if not wants_drafts(s) or req.request_id in failed:
                continue
            k = draft_budget(req, self.num_draft_tokens, self.max_model_len, decoder)
            forced: list[int] = []
            guided = req.params.guided_decoding is not None and req.output_token_ids
            if k and decoder is not None and guided and req.slot is not None:
                try:
                    forced = decoder.forced_tokens(req.slot, req.output_token_ids[-1], k)
                except RequestError as exc:
                    message = f"request {req.request_id} (slot {req.slot}) {exc}"
                    failures.append((req.request_id, message))
                    continue
            drafts = forced
            if self.drafter is not None and len(drafts) < k:
                more = self.drafter.propose([*req.all_token_ids, *drafts], k - len(drafts))
                drafts = [*drafts, *more]
            req.draft_tokens = drafts
            if forced and req.slot is not None:
                self._forced[req.slot] = len(forced)
                self.proposed += len(forced)
        return failures

    def free(self, slot: int) -> None:
        """The slot's request ended: its last proposal is not verified."""
        self._forced.pop(slot, None)


class DraftModelSpeculator:
    """A smaller model proposes ``num_draft_tokens`` tokens per step under the same grammar.

    The draft model keeps its own KV cache per slot, synced to the accepted tokens: each drafting
    loop feeds what it has not seen yet, then one token per draft step, and crops its drafts away.
    """

    def __init__(
        self, model: LoadedModel, *, max_num_seqs: int, num_draft_tokens: int, max_model_len: int
    ) -> None:
        self.runner = BatchedModelRunner(model, max_num_seqs=max_num_seqs)
        self.num_draft_tokens, self.max_model_len = num_draft_tokens, max_model_len
        self.vocab_size = model.tokenizer.vocab_size

    def propose(self, batch: Sequence[Scheduled], decoder: GuidedDecoder | None) -> list[Failure]:
        rows = [i for i, s in enumerate(batch) if wants_drafts(s)]
        for s in batch:
            s.request.draft_tokens, s.request.draft_probs = [], None
        if not rows:
            if decoder is not None:
                counts = [1 + s.request.num_accepted_drafts for s in batch]
                return decoder.rollback_rejected_batch(counts)
            return []
        failures: list[Failure] = []
        proposals: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        for step in range(self.num_draft_tokens):
            logits = self._draft_logits(batch, rows, proposals, step)
            if decoder is not None:
                failures += self._mask(decoder, batch, rows, proposals, logits, step)
            self._pick(batch, rows, logits, proposals, probs)
        self._finish_loop(batch, rows, proposals, probs, decoder)
        return failures

    def _draft_logits(
        self,
        batch: Sequence[Scheduled],
        rows: list[int],
        proposals: list[list[int]],
        step: int,
    ) -> torch.Tensor:
        inputs = []
        for row, proposal in zip(rows, proposals, strict=True):
            req = batch[row].request
            assert req.slot is not None
            if step == 0:
                tokens = req.all_token_ids[self.runner.num_cached(req.slot) :]
            else:
                tokens = proposal[-1:]
            inputs.append(ForwardInput(req.slot, tokens))
        return self.runner.forward(inputs)

    def _mask(
        self,
        decoder: GuidedDecoder,
        batch: Sequence[Scheduled],
        rows: list[int],
        proposals: list[list[int]],
        logits: torch.Tensor,
        step: int,
    ) -> list[Failure]:
        """Apply the grammar to the draft logits: one row per request of the verified batch."""
        full = torch.zeros(len(batch), logits.shape[1], dtype=logits.dtype, device=logits.device)
        full[rows] = logits
        if step == 0:
            new_tokens = [s.request.all_token_ids[-1] for s in batch]
            counts = [1 + s.request.num_accepted_drafts for s in batch]
            decoder.add_draft_batch(new_tokens, counts, draft_step=0)
        else:
            new_tokens = [0] * len(batch)
            for row, proposal in zip(rows, proposals, strict=True):
                new_tokens[row] = proposal[-1]
            decoder.add_draft_batch(new_tokens, draft_step=step)
        failures = decoder.execute_draft_batch(full, draft_step=step)
        logits.copy_(full[rows])
        return failures

    def _pick(
        self,
        batch: Sequence[Scheduled],
        rows: list[int],
        logits: torch.Tensor,
        proposals: list[list[int]],
        probs: list[list[torch.Tensor]],
    ) -> None:
        for i, row in enumerate(rows):
            req = batch[row].request
            params, row_logits = req.params, logits[i : i + 1]
            if params.is_greedy:
                token = int(torch.argmax(row_logits[0]))
            else:
                dist = processed_probs(row_logits, params)
                probs[i].append(dist[0])
                token = sample(row_logits, [params], [req.draft_generator])[0]
            proposals[i].append(token)

    def _finish_loop(
        self,
        batch: Sequence[Scheduled],
        rows: list[int],
        proposals: list[list[int]],
        probs: list[list[torch.Tensor]],
        decoder: GuidedDecoder | None,
    ) -> None:
        for i, row in enumerate(rows):
            req = batch[row].request
            assert req.slot is not None
            self.runner.crop(req.slot, len(req.all_token_ids))
            k = draft_budget(req, self.num_draft_tokens, self.max_model_len, decoder)
            req.draft_tokens = proposals[i][:k]
            req.draft_probs = torch.stack(probs[i][:k]) if probs[i] and k else None

    def free(self, slot: int) -> None:
        self.runner.free(slot)


def parse_speculative(spec: str | None) -> tuple[str, str | None] | None:
    """``None``, ``"ngram"`` or ``"draft:<model>"`` as ``(kind, model)``."""
    if spec is None:
        return None
    if spec == "ngram":
        return ("ngram", None)
    if spec.startswith(DRAFT_PREFIX) and len(spec) > len(DRAFT_PREFIX):
        return ("draft", spec[len(DRAFT_PREFIX) :])
    raise ValueError(f"speculative must be None, 'ngram' or 'draft:<model>', got {spec!r}")
