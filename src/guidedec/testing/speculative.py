"""A scripted speculative-decoding harness: a deterministic target model, drafters and a greedy
runner that drives a :class:`~guidedec.decoder.GuidedDecoder` the way an engine does.

Greedy guided generation must produce the same tokens with and without speculation, whatever the
drafter proposes; with ``oracle`` set, the runner also checks every bitmask row and every matcher
state against fresh matchers fed the same tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import torch

from guidedec.bitmask import apply_bitmask, row_has_valid_token
from guidedec.decoder import GuidedDecoder, GuidedRequest, GuidedStep
from guidedec.grammar import GrammarMatcher, GrammarMatcherFactory, GuidedDecodingParams
from guidedec.testing.generate import GeneratedOutput
from guidedec.testing.matchers import feed_tokens, next_token_mask

RollbackPath = Literal["batch", "snapshot"]


class ScriptedTarget:
    """A stand-in language model whose logits are a pure function of the seed and the prefix.

    Each prefix picks one of ``num_rows`` seeded Gaussian rows by a hash of its tokens, so the
    same prefix gets the same logits in any batch, order or run; different prefixes mostly get
    different ones.
    """

    def __init__(self, vocab_size: int, *, seed: int = 0, num_rows: int = 64) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.seed = seed
        self._rows = torch.randn(num_rows, vocab_size, generator=generator)

    def logits(self, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[len(prefixes), vocab_size]`` float32 logits, one row per prefix (a fresh tensor)."""
        index = [self._row_of(prefix) for prefix in prefixes]
        return self._rows[index].clone()

    def _row_of(self, prefix: Sequence[int]) -> int:
        data = np.asarray(prefix, dtype=np.int64).tobytes()
        digest = hashlib.blake2b(data, digest_size=8, key=self.seed.to_bytes(8, "little"))
        return int.from_bytes(digest.digest(), "little") % self._rows.shape[0]


class Drafter(Protocol):
    """Proposes draft tokens for a sequence (no logits: n-gram style)."""

    def propose(self, prompt: Sequence[int], tokens: Sequence[int], count: int) -> list[int]:
        """At most ``count`` tokens to follow ``tokens`` (the output so far)."""
        ...


@dataclass
class GreedyDrafter:
    """Proposes the target's own guided greedy continuation (all accepted), or variations of it.

    ``past_stop``: keep proposing the target's raw greedy tokens after the grammar terminates,
    i.e. drafts longer than the remaining grammar. ``stop_at``: put a stop token at that draft
    position instead. ``rank``: propose the grammar-valid token of that rank in the target's
    logits (1: valid but wrong wherever two tokens are valid).
    """

    target: ScriptedTarget
    factory: GrammarMatcherFactory
    guides: Sequence[GuidedDecodingParams | None]  # by sequence index (``prompt[0]``)
    stop_token_id: int
    past_stop: bool = False
    stop_at: int | None = None
    rank: int = 0

    def propose(self, prompt: Sequence[int], tokens: Sequence[int], count: int) -> list[int]:
        params = self.guides[prompt[0]]
        matcher = None if params is None else self.factory.create(params)
        if matcher is not None and feed_tokens(matcher, tokens) != len(tokens):
            return []
        proposal: list[int] = []
        while len(proposal) < count:
            logits = self.target.logits([[*prompt, *tokens, *proposal]])[0]
            if matcher is None or matcher.is_terminated():
                if matcher is not None and not self.past_stop:
                    break
                token = int(torch.argmax(logits))
            elif len(proposal) == self.stop_at:
                token = self.stop_token_id
            else:
                token = _ranked_valid_token(matcher, logits, self.rank)
            proposal.append(token)
            live = matcher is not None and not matcher.is_terminated()
            if live and matcher is not None and not matcher.accept_token(token):
                break
        return proposal


def _ranked_valid_token(matcher: GrammarMatcher, logits: torch.Tensor, rank: int) -> int:
    row = next_token_mask(matcher, logits.shape[0])
    masked = logits.unsqueeze(0).clone()
    apply_bitmask(masked, row.unsqueeze(0), backend="torch")
    order = torch.argsort(masked[0], descending=True)
    valid = int(torch.isfinite(masked[0]).sum())
    return int(order[min(rank, max(valid - 1, 0))])


@dataclass
class RandomDrafter:
    """Proposes random token ids, a pure function of the seed and the sequence."""

    vocab_size: int
    seed: int = 0

    def propose(self, prompt: Sequence[int], tokens: Sequence[int], count: int) -> list[int]:
        seed = hash((self.seed, *prompt, *tokens)) & 0x7FFF_FFFF
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(self.vocab_size, (count,), generator=generator).tolist()


@dataclass
class _Sequence:
    index: int
    params: GuidedDecodingParams | None
    output: GeneratedOutput = field(default_factory=lambda: GeneratedOutput([], False))
    drafts: list[int] = field(default_factory=list)
    num_accepted_drafts: int = 0  # in the last verification
    last_token: int = 0  # sampled in the last verification (the next new token)
    started: bool = False
    done: bool = False

    @property
    def prompt(self) -> tuple[int, ...]:
        return (self.index,)


@dataclass
class RunnerStats:
    """What a run exercised: verification steps, drafts proposed and accepted, stop tokens
    accepted inside drafts, rollbacks checked by the oracle."""

    steps: int = 0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    stops_inside_drafts: int = 0
    rows_checked: int = 0
    states_checked: int = 0


class GreedyRunner:
    """Greedy guided generation through ``decoder`` from a :class:`ScriptedTarget`.

    Without a drafter it is plain guided greedy decoding. With ``drafter`` (no logits) each step
    verifies its proposals and rolls back with ``rollback_rejected_batch`` (``rollback="batch"``)
    or with ``rollback_rejected_tokens`` on the next snapshots (``"snapshot"``). With
    ``draft_model`` the drafting loop runs the draft model's logits through
    ``add_draft_batch``/``execute_draft_batch``. ``oracle`` (a factory for the same backend)
    checks each filled row and each rolled-back matcher against fresh matchers. ``stepper``
    runs the target steps (``add_batch``, ``execute``, ``rollback_rejected_batch``) instead of
    ``decoder`` (a ``CapturableGuidedDecoder`` wrapping it); the rest goes to ``decoder``.
    """

    def __init__(
        self,
        decoder: GuidedDecoder,
        target: ScriptedTarget,
        *,
        drafter: Drafter | None = None,
        draft_model: ScriptedTarget | None = None,
        num_draft_tokens: int = 0,
        max_tokens: int = 64,
        rollback: RollbackPath = "batch",
        oracle: GrammarMatcherFactory | None = None,
        stepper: GuidedStep | None = None,
    ) -> None:
        if (drafter or draft_model) and not 0 < num_draft_tokens <= decoder.max_num_draft_tokens:
            raise ValueError("num_draft_tokens must be in [1, decoder.max_num_draft_tokens]")
        if stepper is not None and rollback == "snapshot":
            raise ValueError("rollback='snapshot' reads the batch of add_batch: no stepper")
        self.decoder, self.target = decoder, target
        self.steps: GuidedStep = decoder if stepper is None else stepper
        self.drafter, self.draft_model = drafter, draft_model
        self.num_draft_tokens = num_draft_tokens if (drafter or draft_model) else 0
        self.max_tokens, self.rollback, self.oracle = max_tokens, rollback, oracle
        self.stop_ids = set(decoder.config.tokenizer.stop_token_ids)
        self.stats = RunnerStats()

    def run(self, guides: Sequence[GuidedDecodingParams | None]) -> list[GeneratedOutput]:
        """One output per guide (stop token excluded from ``token_ids``)."""
        seqs = [_Sequence(i, params) for i, params in enumerate(guides)]
        live = list(seqs)
        while live:
            self._target_step(live)
            if self.draft_model is not None:
                self._drafting_loop(live)
            elif self.drafter is not None and self.rollback == "batch":
                counts = [1 + s.num_accepted_drafts for s in live]
                self._record(self.steps.rollback_rejected_batch(counts), live)
            live = [s for s in live if not s.done]
            if self.drafter is not None:
                for seq in live:
                    seq.drafts = self._propose(seq)
        return [s.output for s in seqs]

    # --- one verification step -------------------------------------------------------------

    def _target_step(self, live: list[_Sequence]) -> None:
        requests = [self._request(seq) for seq in live]
        self.steps.add_batch(requests, num_draft_tokens=self.num_draft_tokens)
        if self.rollback == "snapshot" and self.drafter is not None:
            self._record(self.decoder.rollback_rejected_tokens(), live)
        self._check_states(live)
        prefixes = []
        for seq in live:
            base = [*seq.prompt, *seq.output.token_ids]
            prefixes += [base + seq.drafts[:i] for i in range(len(seq.drafts) + 1)]
        logits = self.target.logits(prefixes)
        self._record(self.steps.execute(logits), live)
        self._check_rows(live)
        row = 0
        for seq in live:
            rows = logits[row : row + len(seq.drafts) + 1]
            row += len(seq.drafts) + 1
            if not seq.done:
                self._verify(seq, rows)
        self.stats.steps += 1

    def _request(self, seq: _Sequence) -> GuidedRequest:
        seq.drafts = seq.drafts[: self.num_draft_tokens]
        if not seq.started:
            seq.started = True
            return GuidedRequest.context(seq.params, request_id=seq.index, seq_slot=seq.index)
        return GuidedRequest.generation(
            seq.params,
            request_id=seq.index,
            seq_slot=seq.index,
            new_token=seq.output.token_ids[-1],
            draft_tokens=seq.drafts,
            num_accepted_draft_tokens=seq.num_accepted_drafts,
        )

    def _verify(self, seq: _Sequence, rows: torch.Tensor) -> None:
        choices = torch.argmax(rows, dim=-1).tolist()
        accepted = 0
        while accepted < len(seq.drafts) and choices[accepted] == seq.drafts[accepted]:
            accepted += 1
        seq.num_accepted_drafts = accepted
        self.stats.drafts_proposed += len(seq.drafts)
        self.stats.drafts_accepted += accepted
        new_tokens = [*seq.drafts[:accepted], choices[accepted]]
        seq.last_token = choices[accepted]
        if any(t in self.stop_ids for t in seq.drafts[:accepted]):
            self.stats.stops_inside_drafts += 1
        for token in new_tokens:
            if token in self.stop_ids:
                seq.output.finished = seq.done = True
                return
            seq.output.token_ids.append(token)
            if len(seq.output.token_ids) >= self.max_tokens:
                seq.done = True
                return

    def _propose(self, seq: _Sequence) -> list[int]:
        assert self.drafter is not None
        return self.drafter.propose(seq.prompt, seq.output.token_ids, self.num_draft_tokens)

    def _record(self, failures: list[tuple[int, str]], seqs: Sequence[_Sequence]) -> None:
        by_id = {seq.index: seq for seq in seqs}
        for request_id, message in failures:
            seq = by_id[request_id]
            seq.output.error, seq.done = message, True

    # --- the drafting loop of a draft model ---------------------------------------------------

    def _drafting_loop(self, seqs: list[_Sequence]) -> None:
        assert self.draft_model is not None
        proposals: list[list[int]] = [[] for _ in seqs]
        stopped: set[int] = set()
        for step in range(self.num_draft_tokens):
            if step == 0:
                bonus = [s.last_token for s in seqs]
                counts = [1 + s.num_accepted_drafts for s in seqs]
                self.decoder.add_draft_batch(bonus, counts, draft_step=0)
            else:
                self.decoder.add_draft_batch([p[-1] for p in proposals], draft_step=step)
            pairs = zip(seqs, proposals, strict=True)
            prefixes = [[*s.prompt, *s.output.token_ids, *p] for s, p in pairs]
            logits = self.draft_model.logits(prefixes)
            self._record(self.decoder.execute_draft_batch(logits, draft_step=step), seqs)
            self._check_draft_rows(seqs, proposals, stopped)
            picks = torch.argmax(logits, dim=-1).tolist()
            for proposal, token in zip(proposals, picks, strict=True):
                proposal.append(token)
        for seq, proposal in zip(seqs, proposals, strict=True):
            seq.drafts = proposal

    # --- oracle checks --------------------------------------------------------------------------

    def _check_rows(self, live: list[_Sequence]) -> None:
        """Each request's live rows are exactly those of fresh matchers fed the accepted tokens
        plus draft tokens ``0..i-1``."""
        if self.oracle is None:
            return
        batch = self.decoder.requests
        assert batch is not None
        for seq, offset in zip(live, batch.offsets, strict=True):
            if seq.params is None or seq.done:
                continue
            expected = oracle_rows(
                self.oracle, seq.params, seq.output.token_ids, seq.drafts, self.decoder.vocab_size
            )
            self._compare(seq, offset, len(seq.drafts) + 1, expected)

    def _check_draft_rows(
        self, seqs: list[_Sequence], proposals: list[list[int]], stopped: set[int]
    ) -> None:
        """The draft row of each request is a fresh matcher's mask after the accepted tokens and
        the proposal so far, until guiding stops (for the rest of this drafting loop)."""
        if self.oracle is None:
            return
        vocab = self.decoder.vocab_size
        for row, (seq, proposal) in enumerate(zip(seqs, proposals, strict=True)):
            if seq.params is None or seq.done:
                continue
            expected: list[torch.Tensor] = []
            if seq.index not in stopped:
                fresh = self.oracle.create(seq.params)
                fed = [*seq.output.token_ids, *proposal]
                if feed_tokens(fresh, fed) == len(fed):
                    expected = oracle_rows(self.oracle, seq.params, fed, (), vocab)
            if not expected:
                stopped.add(seq.index)
            self._compare(seq, row, 1, expected)

    def _compare(
        self, seq: _Sequence, offset: int, rows: int, expected: list[torch.Tensor]
    ) -> None:
        live = self.decoder.token_mask_host[offset : offset + rows].tolist()
        assert live == [1] * len(expected) + [0] * (rows - len(expected)), (
            f"sequence {seq.index}: live rows {live}, oracle expects {len(expected)}"
        )
        for i, row in enumerate(expected):
            assert torch.equal(self.decoder.bitmask_host[offset + i], row), (
                f"sequence {seq.index}: row {i} differs from a fresh matcher's"
            )
        self.stats.rows_checked += len(expected)

    def _check_states(self, live: list[_Sequence]) -> None:
        """Each live matcher equals a fresh matcher fed the accepted tokens before the bonus."""
        if self.oracle is None:
            return
        for seq in live:
            matcher = self.decoder.grammar_matchers[seq.index]
            if seq.params is None or matcher is None or not seq.output.token_ids:
                continue
            fresh = self.oracle.create(seq.params)
            fed = seq.output.token_ids[:-1]
            assert feed_tokens(fresh, fed) == len(fed)
            assert not matcher.is_terminated() and not fresh.is_terminated()
            vocab = self.decoder.vocab_size
            assert torch.equal(next_token_mask(matcher, vocab), next_token_mask(fresh, vocab)), (
                f"sequence {seq.index}: matcher state differs from the accepted prefix"
            )
            self.stats.states_checked += 1


def oracle_rows(
    factory: GrammarMatcherFactory,
    params: GuidedDecodingParams,
    accepted: Sequence[int],
    drafts: Sequence[int],
    vocab_size: int,
) -> list[torch.Tensor]:
    """The bitmask rows a decoder must fill after ``accepted``: row ``i`` is a fresh matcher's
    mask after ``accepted + drafts[:i]``, up to a rejected draft token, termination or a
    dead-end row (exclusive)."""
    matcher = factory.create(params)
    assert feed_tokens(matcher, accepted) == len(accepted), "the accepted tokens must be valid"
    rows: list[torch.Tensor] = []
    for i in range(len(drafts) + 1):
        if matcher.is_terminated():
            break
        row = next_token_mask(matcher, vocab_size)
        if not row_has_valid_token(row, vocab_size):
            break
        rows.append(row)
        if i == len(drafts) or not matcher.accept_token(drafts[i]):
            break
    return rows
