"""A step's forward and guide: the model's logits for the batch with every guided row masked,
as :class:`StepRows`, which holds each row however it is represented.

- *Dense* rows: rows of ``logits``, masked in place by the decoder's apply.
- *Sparse* rows (:attr:`StepRows.sparse`, on the CPU): a sampled row whose mask allows at most
  1/32 of the vocabulary is left unmasked, and the sampler reads it at its allowed ids alone
  (two passes over a 129,280-wide row saved where a JSON guide allows a handful of tokens).
- *Point masses* (:attr:`StepRows.point_masses`, on the CPU): a verification row whose mask,
  built before the forward, allows one token is not computed at all (the token there is that
  one, whatever the logits); rejection sampling reads it as a point mass at its token. Other
  verification rows with few allowed tokens get the lm_head of those tokens alone.

Overlap: the mask of step n depends only on tokens sampled up to step n - 1, so with
``overlap`` the decoder's build runs while the forward does (on a worker thread on the CPU; on
a CUDA device, on the host right after the forward is enqueued), and only the copy and apply
wait for the logits. A pure decode step under CUDA graphs is a replay with the decoder's step
inside (:class:`~guidedec.engine.graphs.DecodeGraphs`): its build is not timed apart.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from guidedec.decoder import GuidedDecoder, GuidedRequest
from guidedec.engine.graphs import DecodeGraphs, is_decode_step
from guidedec.engine.logprobs import TokenLogprob, token_logprob
from guidedec.engine.runner import ForwardInput, SlotRunner
from guidedec.engine.sampling import SamplingParams, sample
from guidedec.engine.scheduler import Scheduled
from guidedec.engine.stats import STEP_TIMES_KEPT, EngineStats, StepTimes
from guidedec.engine.verification import TargetRows

SPARSE_SHARE = 32
"""A row whose mask allows at most ``vocab_size // SPARSE_SHARE`` tokens is read sparsely."""


@dataclass
class StepRows:
    """One step's logits rows (see the module's docstring) and what the guide said of them."""

    logits: torch.Tensor
    failures: dict[int, str]
    """Requests the decoder failed, by id, with the message."""
    decoder: GuidedDecoder | None
    """The decoder that guided the step; None for an unguided batch."""
    forward_end: float
    guide_end: float
    sparse: dict[int, torch.Tensor] = field(default_factory=dict)
    """Row -> its allowed token ids, for rows left unmasked."""
    point_masses: dict[int, dict[int, int]] = field(default_factory=dict)
    """Request id -> {row within the request's rows: the one token its mask allows}."""

    def draw(self, batch: list[Scheduled]) -> dict[int, int]:
        """The sampled (not greedy) next token of every request of ``batch`` that takes one
        from its last row without verifying drafts, by request id: one :func:`sample` call for
        the step, sparse rows read at their allowed tokens only."""
        rows, params, generators, ids = [], [], [], []
        end = 0
        for s in batch:
            end += s.num_logits
            req = s.request
            if s.draws_one and req.request_id not in self.failures:
                rows.append(end - 1)
                params.append(req.params)
                generators.append(req.generator)
                ids.append(req.request_id)
        if not rows:
            return {}
        tokens = sample(self.logits, params, generators, rows=rows, allowed=self.sparse)
        return dict(zip(ids, tokens, strict=True))

    def redraw(
        self,
        row: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        banned: list[int],
    ) -> int | None:
        """A token from ``row`` with ``banned`` tokens removed (None when nothing is left)."""
        ids = self.sparse.get(row)
        if ids is not None:
            kept = ids[~torch.isin(ids, torch.tensor(banned, dtype=ids.dtype))]
            if kept.numel() == 0:
                return None
            return sample(self.logits, [params], [generator], rows=[row], allowed={row: kept})[0]
        x = self.logits[row : row + 1].clone()
        x[0, banned] = -math.inf
        if not bool(torch.isfinite(x.amax())):
            return None
        return sample(x, [params], [generator])[0]

    def logprob(self, row: int, token: int, params: SamplingParams) -> TokenLogprob:
        """``token``'s log-probability at ``row`` (masked in place, or read at its allowed ids
        when sparse), with the row's ``params.logprobs`` most likely tokens."""
        assert params.logprobs is not None
        return token_logprob(
            self.logits[row],
            token,
            temperature=params.temperature,
            num_top=params.logprobs,
            allowed=self.sparse.get(row),
        )

    def target(self, rows: slice, params: SamplingParams, request_id: int) -> TargetRows:
        """A request's verification rows, as rejection sampling reads them (its point masses
        included)."""
        return TargetRows(self.logits[rows], params, self.point_masses.get(request_id))


class MaskedForward:
    """Runs a batch's forward and its guide, eagerly or as a graph replay."""

    def __init__(
        self,
        runner: SlotRunner,
        decoder: GuidedDecoder,
        *,
        graphs: DecodeGraphs | None,
        device: torch.device,
        stats: EngineStats,
        vocab_size: int,
        max_model_len: int,
        num_draft_tokens: int,
        overlap: bool,
    ) -> None:
        self.runner, self.decoder, self.graphs, self.stats = runner, decoder, graphs, stats
        self.cpu = device.type == "cpu"
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.num_draft_tokens, self.overlap = num_draft_tokens, overlap
        self.step_times: deque[StepTimes] = deque(maxlen=STEP_TIMES_KEPT)
        self.forward_s = 0.0  # the last eager step's forward
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="guidedec-build")

    def run(self, batch: list[Scheduled]) -> StepRows:
        """The batch's logits rows, guided; ``decoder`` None when no request is guided."""
        inputs = [ForwardInput(_slot(s), s.token_ids, s.num_logits) for s in batch]
        if self.graphs is not None and is_decode_step(inputs):
            self.runner.check_inputs(inputs)  # before queuing: a refused step queues nothing
            decoder = self._guide(batch, queued=True)
            logits, failures = self.graphs.run(inputs, guided=decoder is not None)
            end = time.perf_counter()  # the guide ran inside the replay
            return StepRows(logits, dict(failures), decoder, end, end)
        return self._eager(batch, inputs, self._guide(batch))

    def close(self) -> None:
        self._builder.shutdown(wait=True)

    def _eager(
        self, batch: list[Scheduled], inputs: list[ForwardInput], decoder: GuidedDecoder | None
    ) -> StepRows:
        """Forward, then build (or finish the overlapped build), copy and apply."""
        cpu = self.cpu
        built, pending = None, None
        point_masses: dict[int, dict[int, int]] = {}
        if decoder is not None and cpu and any(s.verifies for s in batch):
            # The masks first: a verification row its guide narrows to one token (text the
            # grammar forces) needs no logits, a row narrowed to a few the lm_head of those
            # alone, and on the CPU a full lm_head row costs about what a step costs.
            built = _timed_build(decoder)
            inputs = self._without_forced_logits(batch, inputs, decoder, point_masses)
        elif decoder is not None and self.overlap and cpu:
            pending = self._builder.submit(_timed_build, decoder)
        began = time.perf_counter()
        logits = self.runner.forward(inputs)
        t1 = time.perf_counter()
        self.forward_s = t1 - began  # the forward alone (a build may run before it)
        if decoder is None:
            return StepRows(logits, {}, None, t1, t1)
        # On a CUDA device the forward above only enqueued its kernels: this build runs
        # while they do (the wait measured here is host time, an upper bound).
        build, build_s = built or (pending.result() if pending else _timed_build(decoder))
        ready = time.perf_counter()
        sparse = self._take_sparse_rows(batch, decoder, logits)
        decoder.copy_and_apply(logits)
        t2 = time.perf_counter()
        self._record(StepTimes(build_s, ready - t1, t2 - ready))
        return StepRows(logits, dict(build), decoder, t1, t2, sparse, point_masses)

    def _without_forced_logits(
        self,
        batch: list[Scheduled],
        inputs: list[ForwardInput],
        decoder: GuidedDecoder,
        point_masses: dict[int, dict[int, int]],
    ) -> list[ForwardInput]:
        """``inputs`` with ``no_logits`` set to the verification rows whose mask, just built,
        allows one token, each recorded in ``point_masses``; every other row whose mask allows
        few tokens gets ``sparse_logits``: the lm_head of its allowed tokens alone (the mask
        sets the others to -inf, and nothing reads them)."""
        out, row = [], 0
        limit = max(1, self.vocab_size // SPARSE_SHARE)
        for s, item in zip(batch, inputs, strict=True):
            rows = range(row, row + item.num_logits)
            single: dict[int, int] = {}
            if s.verifies:
                single = {r - row: token for r, token in decoder.single_token_rows(rows).items()}
                if single:
                    item = dataclasses.replace(item, no_logits=tuple(single))
                    self.stats.rows_without_logits += len(single)
                    point_masses[s.request.request_id] = single
            sparse = tuple(
                (r - row, tuple(ids.tolist()))
                for r, ids in decoder.sparse_rows(rows, limit).items()
                if r - row not in single
            )
            if sparse:
                item = dataclasses.replace(item, sparse_logits=sparse)
                self.stats.rows_with_sparse_logits += len(sparse)
            out.append(item)
            row += item.num_logits
        return out

    def _take_sparse_rows(
        self, batch: list[Scheduled], decoder: GuidedDecoder, logits: torch.Tensor
    ) -> dict[int, torch.Tensor]:
        """The allowed token ids of the host rows that are sampled and whose mask allows few
        tokens; the decoder leaves these rows unmasked."""
        if logits.device.type != "cpu":
            return {}
        rows, end = [], 0
        for s in batch:
            end += s.num_logits
            if s.draws_one:
                rows.append(end - 1)
        if not rows:
            return {}
        return decoder.take_sparse_rows(rows, max(1, self.vocab_size // SPARSE_SHARE))

    def _guide(self, batch: list[Scheduled], *, queued: bool = False) -> GuidedDecoder | None:
        """Snapshot the batch for the decoder; None when no request in it is guided.

        ``queued``: for a graph replay, whose host functions take the snapshot from the
        capturable decoder's queue. Otherwise the decoder takes it directly: an eager step
        builds from it, and a snapshot left in the queue would be taken by the next replay in
        place of its own.
        """
        if all(s.request.params.guided_decoding is None for s in batch):
            return None
        snapshots = [_snapshot(s, self.max_model_len) for s in batch]
        if queued:
            assert self.graphs is not None
            self.graphs.decoder.add_batch(snapshots, num_draft_tokens=self.num_draft_tokens)
        else:
            self.decoder.add_batch(snapshots, num_draft_tokens=self.num_draft_tokens)
        return self.decoder

    def _record(self, times: StepTimes) -> None:
        self.step_times.append(times)
        self.stats.build_s += times.build_s
        self.stats.mask_wait_s += times.wait_s
        self.stats.apply_s += times.apply_s


def _timed_build(decoder: GuidedDecoder) -> tuple[list[tuple[int, str]], float]:
    start = time.perf_counter()
    failures = decoder.build()
    return failures, time.perf_counter() - start


def _slot(s: Scheduled) -> int:
    assert s.request.slot is not None
    return s.request.slot


def _snapshot(s: Scheduled, max_model_len: int) -> GuidedRequest:
    req = s.request
    assert req.slot is not None
    params = None if req.thinking else req.params.guided_decoding
    left = req.tokens_left(max_model_len) if req.params.close_within_budget else None
    if s.is_prefill or req.guide_starts:  # the guide's start: a matcher, its first row
        assert s.is_prefill or not s.token_ids[1:], "no drafts where the guide starts"
        return GuidedRequest.context(
            params,
            request_id=req.request_id,
            seq_slot=req.slot,
            is_last_context_chunk=s.is_last_chunk or not s.is_prefill,
            tokens_left=left,
        )
    return GuidedRequest.generation(
        params,
        request_id=req.request_id,
        seq_slot=req.slot,
        new_token=s.token_ids[0],
        draft_tokens=s.token_ids[1:],
        is_generation_only_first_iteration=req.generation_only_first,
        tokens_left=left,
    )
