"""The decoder's step: grammar matchers per sequence slot, host bitmask build, copy, apply.

One step: ``add_batch(snapshots)`` -> ``build()`` (host: advance matchers, fill bitmask rows,
check each row) -> ``copy_bitmask()`` -> ``apply_bitmask(logits)``; ``execute(logits)`` does all
three after ``add_batch``. Failures are returned as ``(request_id, message)`` and never raised:
the engine finishes those requests after sampling, and the rest of the batch goes on.
:class:`guidedec.decoder.GuidedDecoder` adds the speculative-decoding rollbacks on top.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from time import perf_counter

import torch

from guidedec.decoder.advance import MatcherAdvance
from guidedec.decoder.buffers import BitmaskBuffers
from guidedec.decoder.closing import MARGIN, BudgetCloser
from guidedec.decoder.errors import Failure, SlowMasksError, failure_message
from guidedec.decoder.fill_timing import FillTiming
from guidedec.decoder.profiling import nvtx_range
from guidedec.decoder.request import GuidedRequest, GuidedRequests
from guidedec.decoder.row_rules import RowRules
from guidedec.decoder.rows import RowFill, RowFiller
from guidedec.decoder.slots import SlotState
from guidedec.decoder.stats import DecoderStats
from guidedec.decoder.token_checks import TokenChecks
from guidedec.errors import REQUEST_ERRORS
from guidedec.grammar.batch_fill import BatchFiller
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.matcher import (
    GrammarMatcher,
    GrammarMatcherFactory,
)
from guidedec.grammar.params import GuidedDecodingParams


class BaseGuidedDecoder:
    """Batched guided decoding over ``max_num_sequences`` sequence slots: one step at a time.

    Buffers: ``max_num_sequences * (max_num_draft_tokens + 1)`` bitmask rows of
    ``ceil(vocab_size / 32)`` int32 words, and an int32 ``token_mask`` per row (1 = apply the row).
    Per slot state (``slots``, a :class:`~guidedec.decoder.slots.SlotState`): the matcher
    (``grammar_matchers``) and the counters of speculative decoding, ``num_advanced_tokens``
    (matcher advances in the last build), ``num_guided_tokens`` (rows filled in the last build),
    ``num_advanced_draft_tokens`` (advances during the current drafting loop) and
    ``is_draft_terminated`` (guiding of the current drafting loop has stopped).

    Args:
        config: The decoder's settings (fill mode, mask-time limit) and its tokenizer, whose
            (padded) ``vocab_size`` is the width of the logits.
        factory: The matcher factory, for ``config.tokenizer``
            (:func:`guidedec.create_grammar_matcher_factory`); an engine shares one between its
            decoders and its compile pool, so that each guide is compiled once.
        max_num_sequences: Number of sequence slots (the engine's batch capacity).
        max_num_draft_tokens: Draft tokens per sequence in speculative decoding (0: none).
        device: Where the logits live; the host buffers are pinned when it is a CUDA device.
        rank: The global rank, for logits sharded over the vocabulary by tensor parallelism:
            logits ``V / T`` columns wide are shard ``rank % T`` (see
            :func:`guidedec.bitmask.apply_bitmask_sharded`).
        closing_margin: Room a closing witness must leave before its rows are forced
            (:class:`~guidedec.decoder.closing.BudgetCloser`); 0 for an engine that checks each
            sampled token (:attr:`token_checks`).
    """

    def __init__(
        self,
        *,
        config: GuidedDecodingConfig,
        factory: GrammarMatcherFactory,
        max_num_sequences: int,
        max_num_draft_tokens: int = 0,
        device: str | torch.device = "cpu",
        rank: int = 0,
        closing_margin: int = MARGIN,
    ) -> None:
        if max_num_sequences <= 0 or max_num_draft_tokens < 0:
            raise ValueError("max_num_sequences must be > 0 and max_num_draft_tokens >= 0")
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        self.config = config
        self.max_num_sequences = max_num_sequences
        self.max_num_draft_tokens = max_num_draft_tokens
        self.vocab_size = config.tokenizer.vocab_size
        self.device = torch.device(device)
        self.rank = rank
        self.factory = factory
        self.buffers = buffers = BitmaskBuffers(
            self.max_num_rows, self.vocab_size, self.device, rank
        )
        # The buffers under their public names (the same tensors).
        self.bitmask_host, self.token_mask_host = buffers.bitmask_host, buffers.token_mask_host
        self.bitmask, self.token_mask = buffers.bitmask, buffers.token_mask
        self.sync = buffers.sync
        self.slots = slots = SlotState.empty(max_num_sequences)
        # The slots' lists under their public names (the same list objects).
        self.grammar_matchers = slots.matchers
        self.num_advanced_tokens = slots.num_advanced_tokens
        self.num_guided_tokens = slots.num_guided_tokens
        self.num_advanced_draft_tokens = slots.num_advanced_draft_tokens
        self.is_draft_terminated = slots.is_draft_terminated
        self._num_verifiable_tokens = slots.num_verifiable_tokens
        self.requests: GuidedRequests | None = None
        self.stats = DecoderStats()
        self.closer = BudgetCloser(config.tokenizer, max_num_sequences, margin=closing_margin)
        self.rules = RowRules(config.tokenizer)
        limit = config.mask_time_limit_ms
        self.timing = FillTiming(slots, math.inf if limit is None else limit / 1e3)
        self._filler = BatchFiller(config.fill_mode, config.fill_threads)
        self.rows = RowFiller(buffers, slots, self.timing, self._filler, self.stats, self._fail)
        self.token_checks = TokenChecks(slots.matchers, lambda: self.closer)
        self.advancer = MatcherAdvance(
            slots,
            buffers,
            self.stats,
            self._create_matcher,
            lambda r: self.closer.forced_next(r),
            lambda slot: self.closer.moved(slot),
        )

    def warm_up(self) -> None:
        """Build the tokenizer tables closing and the row rules read (~1 s each) now, not at
        a first guided row beside running requests."""
        self.closer.warm_up()
        self.rules.warm_up()

    @property
    def max_num_rows(self) -> int:
        """Bitmask rows: one per sequence position (new token + each draft token)."""
        return self.max_num_sequences * (self.max_num_draft_tokens + 1)

    def add_batch(
        self, requests: Sequence[GuidedRequest], *, num_draft_tokens: int | None = None
    ) -> None:
        """Snapshot this step's scheduled requests, in logits-row order, for the calls that
        follow (``build``, copy, apply).

        ``num_draft_tokens`` is this step's draft length (default: ``max_num_draft_tokens``);
        a shorter runtime draft length only uses that many draft rows per request.
        """
        self.requests = self.snapshot(requests, num_draft_tokens=num_draft_tokens)

    def snapshot(
        self, requests: Sequence[GuidedRequest], *, num_draft_tokens: int | None = None
    ) -> GuidedRequests:
        """The batch of ``requests`` as :meth:`add_batch` would take it, checked against this
        decoder's slots and rows (``ValueError``), without taking it."""
        draft_len = self.max_num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        if not 0 <= draft_len <= self.max_num_draft_tokens:
            raise ValueError(
                f"num_draft_tokens={num_draft_tokens} must be in [0, max_num_draft_tokens="
                f"{self.max_num_draft_tokens}]"
            )
        batch = GuidedRequests(list(requests), draft_len)
        batch.check_fits(self.max_num_rows, self.max_num_sequences)
        return batch

    def init_disagg_gen_requests(self) -> list[Failure]:
        """Create the matchers of generation-only requests (prefill done by another engine) in
        their first step here.

        Call after ``add_batch`` and before the drafting loop, whose draft requests share the
        matcher. Without speculation it may be skipped: ``build`` creates any such matcher not
        created here. Returns the requests whose guide failed to compile.
        """
        failures: list[Failure] = []
        for req in self._batch().valid_requests():
            if not (req.is_generation_only_first_iteration and req.require_matcher_init()):
                continue
            try:
                self._create_matcher(req)
                self.advancer.disagg_init[req.request_id] = True
            except REQUEST_ERRORS as exc:
                failures.append((req.request_id, failure_message(req, exc)))
                self.advancer.disagg_init[req.request_id] = False
        return failures

    def _create_matcher(self, req: GuidedRequest) -> None:
        assert req.guided_decoding_params is not None
        slot = req.seq_slot
        self.closer.forget(slot)
        self.slots.reset(slot)  # a failed create leaves the slot empty
        matcher = self.new_matcher(req.guided_decoding_params, closing=req.tokens_left is not None)
        self.slots.start(slot, matcher)

    def new_matcher(self, params: GuidedDecodingParams, *, closing: bool = False) -> GrammarMatcher:
        """A matcher at the start of ``params``' guide, under the row rules of a request with
        that guide (and with budget-aware closing or not): every row it fills is the row's
        allowed set, whoever fills it (see :mod:`guidedec.decoder.row_rules`).

        Raises:
            GrammarError: the guide cannot be compiled.
        """
        return self.rules.wrap(self.factory.create(params), params, closing=closing)

    def build(self) -> list[Failure]:
        """Advance every guided request's matcher and fill its bitmask rows (host side).

        Returns the requests that cannot go on, as ``(request_id, message)``; their rows are
        left unmasked (never all-forbidden), so their logits never become NaN.
        """
        sync = self.sync
        if sync.trace is not None:
            sync.note("host: build")
        batch = self._batch()
        start = perf_counter()
        if sync.on_cuda:
            with nvtx_range("guided_decoder.build"):
                failures = self._build(batch)
        else:  # no range to push: skip the context manager, on the hot path of a CPU step
            failures = self._build(batch)
        took = perf_counter() - start
        stats = self.stats
        stats.build_s = took
        stats.steps += 1
        self.timing.end(batch, took)
        if failures:
            stats.failures += len(failures)
        return failures

    def _build(self, batch: GuidedRequests) -> list[Failure]:
        """Advance each request's matcher and fill its rows.

        When no wave could be large enough for a parallel fill (the common case, kept lean),
        each request is filled as soon as it has advanced, through all its rows. Otherwise rows
        are filled in waves: the new-token rows of every request in one batch fill, then each
        request advances by its next draft token and the next wave fills the rows after them.
        Per request both are the same sequence of matcher calls.
        """
        self.buffers.clear()
        failures: list[Failure] = []
        requests, rows, advance = batch.requests, self.rows, self.advancer
        eager = len(requests) < rows.min_wave
        fuse = eager and not self.timing.active  # advance and fill in one call
        wave: list[RowFill] = []
        draft_len = batch.num_draft_tokens
        self.timing.begin(batch)
        advanced, guided = self.num_advanced_tokens, self.num_guided_tokens
        closing: list[tuple[GuidedRequest, int]] = []  # budget-aware closing after the fill
        offsets = batch.offsets  # the requests' own: indexed (a zip costs 0.1 to 0.3 us)
        for i, req in enumerate(requests):
            if req.guided_decoding_params is None:
                continue
            slot, offset = req.seq_slot, offsets[i]
            advanced[slot] = guided[slot] = 0
            drafts = req.draft_tokens[:draft_len] if draft_len and not req.is_draft else ()
            closes = req.tokens_left is not None and not drafts and not req.is_draft
            try:
                if req.is_generation_in_progress_state and not (
                    req.is_draft or req.is_generation_only_first_iteration
                ):  # most requests of most steps: their matcher advances by new_token
                    started = advance.running(req, offset, drafts, closes=closes, fuse=fuse)
                else:
                    matcher = advance.start(req, drafts)
                    started = None if matcher is None else (matcher, False)
                if started is None:
                    continue  # no row to fill
                matcher, filled = started
                if closes:
                    closing.append((req, offset))
                if eager:
                    rows.fill_request(req, matcher, offset, drafts, filled=filled)
                else:
                    wave.append(RowFill(req, matcher, offset, drafts))
            except REQUEST_ERRORS as exc:
                self._fail(req, exc, failures)
        while wave:
            wave = rows.fill_wave(wave, failures)
        if closing:
            self._close(closing, failures)
        if self.advancer.disagg_init and not any(req.is_draft for req in batch.requests):
            self.advancer.disagg_init.clear()
        return failures

    def fill_times(self) -> dict[int, float]:
        """Seconds per request id spent filling rows in the last build, if it timed them."""
        return self.timing.fill_times()

    def _close(self, requests: list[tuple[GuidedRequest, int]], failures: list[Failure]) -> None:
        """Budget-aware closing of the filled one-row requests that carry ``tokens_left``. A
        backend call that fails in it (the closing search runs the matcher back and forth)
        fails the request: its matcher's state is no longer known."""
        words, mask = self.buffers.words, self.buffers.token_mask_np
        for req, row in requests:
            matcher = self.grammar_matchers[req.seq_slot]
            if matcher is None or not mask[row]:
                continue
            try:
                if not matcher.is_terminated():
                    self.closer.close(req, matcher, words[row])
            except REQUEST_ERRORS as exc:
                mask[row] = 0  # never a row the search left half-written
                self._fail(req, exc, failures)

    def _fail(self, req: GuidedRequest, exc: Exception, failures: list[Failure]) -> None:
        failures.append((req.request_id, failure_message(req, exc)))
        self._forget(req)
        params = req.guided_decoding_params
        if isinstance(exc, SlowMasksError) and params is not None:
            self.factory.forget(params)  # its matcher is gone: its compiled guide goes too

    def single_token_rows(self, rows: Sequence[int]) -> dict[int, int]:
        """Those of ``rows`` whose mask, filled by the last build, allows exactly one token, with
        that token: their logits decide nothing (greedy and sampling both take that token), so a
        forward may leave them out (see :attr:`guidedec.engine.runner.ForwardInput.no_logits`)."""
        return self.buffers.single_token_rows(rows)

    def sparse_rows(self, rows: Sequence[int], max_allowed: int) -> dict[int, torch.Tensor]:
        """The allowed token ids (int64, ascending) of those of ``rows`` whose mask, filled by
        the last build, allows at most ``max_allowed`` tokens, by row (the masks stay)."""
        return self.buffers.sparse_rows(rows, max_allowed)

    def take_sparse_rows(self, rows: Sequence[int], max_allowed: int) -> dict[int, torch.Tensor]:
        """Hand over the masks of the given rows of this batch that the last build filled and
        that allow at most ``max_allowed`` tokens, as their allowed token ids (int64, ascending),
        by row; the copy and apply that follow leave those rows of the logits untouched.

        For a caller that samples such rows from their allowed logits alone (see
        :func:`guidedec.bitmask.sparse_allowed_tokens`); it then owns their masking.
        """
        return self.buffers.sparse_rows(rows, max_allowed, take=True)

    def fill_decisions(self) -> dict[tuple[str, int], str]:
        """How ``build`` fills each backend's rows by batch size, as far as ``fill_mode="auto"``
        has measured (see :meth:`guidedec.grammar.batch_fill.BatchFiller.decisions`)."""
        return self._filler.decisions()

    def release_slot(self, seq_slot: int) -> None:
        """Drop the grammar state of a finished or aborted request's slot."""
        self.slots.reset(seq_slot)
        self.closer.forget(seq_slot)

    def move_slot(self, source: int, target: int, *, swap: bool) -> None:
        """The request at ``source`` moves to ``target`` with its grammar state and witness; the
        slots trade (``swap``) or ``source`` is left empty (an engine whose slot is its index)."""
        if not (0 <= source < self.max_num_sequences and 0 <= target < self.max_num_sequences):
            raise ValueError(f"seq_slot {source} or {target} out of range")
        self.slots.move(source, target, swap=swap)
        self.closer.move(source, target, swap=swap)

    def _forget(self, req: GuidedRequest) -> None:
        """Drop a failed request's grammar state; its unverified advances need no rollback."""
        self.release_slot(req.seq_slot)

    def copy_bitmask(self, num_bitmask_tokens: int | None = None) -> None:
        """Copy the filled host rows to the device buffers (nothing to do on the CPU): the
        batch's rows, or ``num_bitmask_tokens`` (see :meth:`apply_bitmask`)."""
        self.copy_rows(self._batch().covered_rows(num_bitmask_tokens, self.max_num_rows))

    def copy_rows(self, num_rows: int) -> None:
        """Copy the first ``num_rows`` host rows (and their token mask) to the device."""
        self.buffers.copy_rows(num_rows)

    def apply_bitmask(
        self, logits: torch.Tensor, *, d2t: torch.Tensor | None = None, num_rows: int | None = None
    ) -> None:
        """Mask ``logits`` in place: rows ``[0, num_bitmask_tokens)`` of this batch, live rows only.

        Masked logits become -inf; rows of unguided, terminated or failed requests are untouched.
        ``num_rows`` (at least the batch's rows) covers a fixed number of rows instead, for a
        graph captured at a padded batch size: rows past the batch are not live after a build.
        Logits narrower than the vocabulary (``vocab_size``, or ``d2t``'s length with ``d2t``) are
        this rank's shard of vocab-sharded logits: they get the columns of the shard, with ``d2t``
        the full table (see :func:`guidedec.bitmask.apply_bitmask_sharded`).
        """
        rows = self._batch().covered_rows(num_rows, self.max_num_rows)
        self.apply_rows(logits, rows, d2t=d2t)

    def apply_rows(
        self, logits: torch.Tensor, num_rows: int, *, d2t: torch.Tensor | None = None
    ) -> None:
        """:meth:`apply_bitmask` over the first ``num_rows`` rows of the device buffers."""
        self.stats.apply_s = self.buffers.apply_rows(logits, num_rows, d2t=d2t)

    def execute(self, logits: torch.Tensor, *, d2t: torch.Tensor | None = None) -> list[Failure]:
        """``build``, ``copy_bitmask`` and ``apply_bitmask`` for the batch of ``add_batch``.

        On a CUDA device the copy runs on the side stream, ordered by ``token_event`` and
        ``bitmask_event`` (:class:`guidedec.decoder.streams.StepSync`); on the CPU all is
        synchronous. Returns the failed requests; the engine finishes them after sampling.
        """
        failures = self.build()
        self.copy_and_apply(logits, d2t=d2t)
        return failures

    def copy_and_apply(self, logits: torch.Tensor, *, d2t: torch.Tensor | None = None) -> None:
        """The second half of ``execute``, after a ``build`` done elsewhere (an engine that
        builds while its forward runs): copy on the side stream, then mask ``logits``."""
        with self.sync.side():
            self.copy_bitmask()
            self.sync.record_bitmask()
        self.sync.wait_bitmask()
        self.apply_bitmask(logits, d2t=d2t)

    def _batch(self) -> GuidedRequests:
        if self.requests is None:
            raise ValueError("add_batch must be called before build/copy/apply")
        return self.requests
