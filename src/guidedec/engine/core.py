"""The engine's step: schedule -> forward -> guide -> sample or verify -> finish -> draft.

The requests the guided decoder reports failed are finished after sampling, as the reference
design does; the rest of the batch goes on.

The forward and the guide of a step are :class:`~guidedec.engine.masked_forward.MaskedForward`'s
(overlapped where they can be; results are the same token for token): it returns the step's
rows (:class:`~guidedec.engine.masked_forward.StepRows`), dense, sparse or point masses, and
the engine samples, checks and verifies from them.

Every step is one batched forward of the model over all scheduled sequences
(:class:`~guidedec.engine.batched_runner.BatchedModelRunner`): decode tokens, verification
chunks and prefill chunks together.

CUDA graphs: with ``cuda_graphs`` the runner's KV cache is static (allocated once, never moved)
and a pure decode step (every sequence feeds one token, no prefill, no drafts) is a graph replay
at the next padded batch size (:class:`~guidedec.engine.graphs.DecodeGraphs`) with the guided
decoder's step inside: the graphs drive the engine's one ``GuidedDecoder`` through a
``CapturableGuidedDecoder`` that wraps it, whose build runs as host functions in the graph, so
``overlap`` does not apply to it, and its time counts as forward time (``step_times`` holds the
eager steps only). Every other step runs eagerly as without graphs, on the decoder itself. With
a speculator every step runs eagerly (verify steps feed drafts). On the CPU a "replay" calls
the captured function again.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import deque
from collections.abc import Sequence

from guidedec.decoder import GuidedDecoder
from guidedec.decoder.capturable import CapturableGuidedDecoder
from guidedec.engine.batched_runner import BatchedModelRunner
from guidedec.engine.grammar_pool import GrammarPool
from guidedec.engine.graphs import DecodeGraphs
from guidedec.engine.handoff import Handoff
from guidedec.engine.logprobs import TokenLogprob
from guidedec.engine.masked_forward import MaskedForward, StepRows
from guidedec.engine.model import LoadedModel
from guidedec.engine.pacing import PACE_WINDOW, pace
from guidedec.engine.prompts import TokenizedPrompt
from guidedec.engine.reasoning import ReasoningParser, content_ids, thinking_token
from guidedec.engine.request import Request, RequestOutput
from guidedec.engine.runner import SlotRunner
from guidedec.engine.sampling import (
    SamplingParams,
    greedy_token,
    greedy_tokens,
    make_draft_generator,
    make_generator,
    verify_greedy_tokens,
    verify_rejection,
)
from guidedec.engine.scheduler import Scheduled, Scheduler
from guidedec.engine.speculative import (
    DraftModelSpeculator,
    JumpForwardSpeculator,
    NgramSpeculator,
)
from guidedec.engine.stats import EngineStats
from guidedec.engine.steering import SampledToken, ValueSteering, check_sampled
from guidedec.engine.stop_strings import stop_string_start
from guidedec.engine.validation import OutputValidator
from guidedec.errors import REQUEST_ERRORS
from guidedec.grammar.closed_objects import closed_guide
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory

Speculator = NgramSpeculator | DraftModelSpeculator | JumpForwardSpeculator


class EngineCore:
    """Requests, slots, the model runner, the guided decoder and the drafter, stepped together.

    ``LLM`` builds one from user-facing options and adds ``generate`` and friends on top.
    """

    def __init__(
        self,
        model: LoadedModel,
        config: GuidedDecodingConfig,
        *,
        max_num_seqs: int,
        max_num_tokens: int,
        num_draft_tokens: int,
        speculator: Speculator | None,
        compile_timeout_s: float,
        overlap: bool = True,
        cuda_graphs: bool = False,
        reasoning: ReasoningParser | None = None,
    ) -> None:
        self.model, self.config = model, config
        self.reasoning = reasoning
        self.tokenizer = model.tokenizer
        self.max_model_len = model.max_model_len
        self.num_draft_tokens, self.max_num_tokens = num_draft_tokens, max_num_tokens
        self.factory = create_grammar_matcher_factory(config)
        self.cuda_graphs = cuda_graphs
        self.graphs: DecodeGraphs | None = None
        runner = BatchedModelRunner(model, max_num_seqs=max_num_seqs, static=cuda_graphs)
        self.decoder = GuidedDecoder(
            config=config,
            factory=self.factory,
            max_num_sequences=max_num_seqs,
            max_num_draft_tokens=num_draft_tokens,
            device=model.device,
            closing_margin=0,  # the engine checks each sampled token: no row is forced
        )
        # The backends' and closing's tokenizer tables, ~1 s each of Python that holds the GIL:
        # now, not beside the first guided requests' steps (they would stall every request).
        self.factory.warm_up()
        self.decoder.warm_up()
        if cuda_graphs and speculator is None:  # decode steps replay; the rest run eagerly
            self.graphs = DecodeGraphs(runner, CapturableGuidedDecoder(self.decoder))
        self.scheduler = Scheduler(max_num_seqs=max_num_seqs, max_num_tokens=max_num_tokens)
        self.grammars = GrammarPool(self.factory, timeout_s=compile_timeout_s)
        self.speculator = speculator
        self.stats = EngineStats()
        self.validator = OutputValidator()
        self.steering = ValueSteering(self.validator, self.decoder.token_checks.structural)
        self.forward = MaskedForward(
            runner,
            self.decoder,
            graphs=self.graphs,
            device=model.device,
            stats=self.stats,
            vocab_size=self.tokenizer.vocab_size,
            max_model_len=self.max_model_len,
            num_draft_tokens=num_draft_tokens,
            overlap=overlap,
        )
        self.step_times = self.forward.step_times  # the eager steps' (see StepTimes)
        self.disable_additional_properties = True  # LLM's option of the name
        self._requests: dict[int, Request] = {}
        self._next_id = 0
        self._handoffs: dict[int, Handoff] = {}
        self._unreported: list[Request] = []  # finished outside a step (aborted)
        self._step_work: deque[float] = deque(maxlen=PACE_WINDOW)  # forward + sampling, s

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests that finished in it."""
        finished = [*self._unreported, *self.grammars.poll()]
        self._unreported.clear()
        for request in finished:
            self._release(request)
        batch = self.scheduler.schedule()
        self.stats.steps_sat_out += self.scheduler.num_sat_out
        if not batch:
            if not finished:
                self.grammars.wait()
        else:
            finished += self._run_batch(batch)
        return [self._finalize(r) for r in finished]

    def abort(self, request_id: int) -> bool:
        """Finish a request with ``"abort"``, freeing its slot and matcher. False if unknown or
        already finished."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished:
            return False
        request.finish("abort")
        self._release(request)
        self._unreported.append(request)
        return True

    @property
    def runner(self) -> SlotRunner:
        """The model runner of the steps; settable between steps (a benchmark's baseline)."""
        return self.forward.runner

    @runner.setter
    def runner(self, value: SlotRunner) -> None:
        self.forward.runner = value

    @property
    def overlap(self) -> bool:
        """Whether a step's build runs while its forward does (see
        :mod:`guidedec.engine.masked_forward`); settable between steps."""
        return self.forward.overlap

    @overlap.setter
    def overlap(self, value: bool) -> None:
        self.forward.overlap = value

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def output_so_far(self, request_id: int) -> list[int] | None:
        """The tokens an unfinished request has generated so far (for streaming); None once it
        has finished or when the id is unknown."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished:
            return None
        return list(request.output_token_ids)

    def logprobs_so_far(self, request_id: int) -> list[TokenLogprob] | None:
        """The log-probabilities of an unfinished request's tokens so far, when it asked for
        them; None otherwise."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished or request.logprobs is None:
            return None
        return list(request.logprobs)

    # --- the step -----------------------------------------------------------------------------

    def _run_batch(self, batch: list[Scheduled]) -> list[Request]:
        self._import_handoffs(batch)
        t0 = time.perf_counter()
        step = self.forward.run(batch)
        self._advance(batch, step)
        t3 = time.perf_counter()
        if self.graphs is None:  # a replay's build is not timed
            self._pace(batch, step.decoder, self.forward.forward_s + (t3 - step.guide_end))
        failures = step.failures
        failures.update(self._speculate(batch, step.decoder))
        self._update_stats(t0, step.forward_end, step.guide_end, t3)
        return self._collect_finished(batch, failures)

    def _pace(self, batch: list[Scheduled], decoder: GuidedDecoder | None, work_s: float) -> None:
        """Let the requests whose masks were slow sit out steps (:mod:`guidedec.engine.pacing`),
        against the engine's usual step: the median of its recent steps' own work (forward and
        sampling), which a slow mask beside the forward inflates."""
        self._step_work.append(work_s)
        times = decoder.fill_times() if decoder is not None else {}
        if times:
            usual = statistics.median(self._step_work)
            self.stats.paced_requests += pace(batch, times, usual)

    def _advance(self, batch: list[Scheduled], step: StepRows) -> None:
        """Sample or verify each request's tokens from the step's rows, checked, and append
        them (a request the guide failed finishes ``grammar_error``)."""
        logits, failures = step.logits, step.failures
        # One pass over every row for the greedy requests; none when every request samples.
        if any(s.request.params.is_greedy for s in batch):
            best = greedy_tokens(logits)
        else:
            best = [None] * logits.shape[0]
        drawn = self._draw(batch, step)  # the sampling requests
        row = 0
        for s in batch:
            rows, row = slice(row, row + s.num_logits), row + s.num_logits
            req = s.request
            req.num_accepted_drafts = 0
            before, starting = len(req.output_token_ids), req.guide_starts
            if req.request_id in failures:
                req.finish("grammar_error", failures[req.request_id])
            elif s.is_prefill:
                req.num_computed += len(s.token_ids)
                if s.is_last_chunk:
                    token = drawn.get(req.request_id)
                    token = greedy_token(best, rows.stop - 1) if token is None else token
                    token = self._checked(s, rows.stop - 1, token, step)
                    if token is not None:
                        self._append(req, [token])
                    req.metrics.first_token = time.perf_counter()
            else:
                token = drawn.get(req.request_id)
                if len(s.token_ids) == 1:  # no drafts: the one token, checked for closing
                    token = greedy_token(best, rows.stop - 1) if token is None else token
                    token = self._checked(s, rows.stop - 1, token, step)
                if not req.is_finished:  # a failed check has finished it
                    self._verify(req, s, rows, best[rows], token, step)
            req.generation_only_first = False
            if starting and not s.is_prefill:
                req.guide_starts = False  # this step created its matcher
            if req.params.logprobs is not None:
                first = rows.stop - 1 if s.is_prefill else rows.start
                self._record_logprobs(req, before, first, step)

    def _record_logprobs(self, req: Request, before: int, first_row: int, step: StepRows) -> None:
        """The log-probabilities of the tokens this step added to ``req`` (the k-th from row
        ``first_row + k``)."""
        entries = req.logprobs
        if entries is None:
            entries = req.logprobs = []
        for k, token in enumerate(req.output_token_ids[before:]):
            entries.append(step.logprob(first_row + k, token, req.params))

    def _draw(self, batch: list[Scheduled], step: StepRows) -> dict[int, int]:
        """The sampled (not greedy) next token of every request that takes one from its last
        row without verifying drafts, by request id: one :func:`sample` call for the step,
        ``sparse`` rows read at their allowed tokens only."""
        rows, params, generators, ids = [], [], [], []
        end = 0
        for s in batch:
            end += s.num_logits
            req = s.request
            if s.draws_one and req.request_id not in step.failures:
                rows.append(end - 1)
                params.append(req.params)
                generators.append(req.generator)
                ids.append(req.request_id)
        if not rows:
            return {}
        tokens = step.draw(rows, params, generators)
        return dict(zip(ids, tokens, strict=True))

    def _checked(
        self,
        s: Scheduled,
        row: int,
        token: int,
        step: StepRows,
    ) -> int | None:
        """``token``, or another one sampled from the same row without it, when after it no
        completion of the request's guide fits what is left of its budget (budget-aware
        closing; see :meth:`guidedec.decoder.closing.BudgetCloser.admits`) or it closes a value
        that breaks the request's schema (see :mod:`guidedec.engine.steering`). The draw is the
        row's distribution restricted to the tokens that pass.

        None when a backend call inside the checks failed: the request has finished with
        ``grammar_error`` naming it (its matcher's state is unknown); the others go on."""
        req = s.request
        guide, slot = req.params.guided_decoding, req.slot
        if guide is None or slot is None:
            return token
        checks = self.decoder.token_checks
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

    def _verify(
        self,
        req: Request,
        s: Scheduled,
        rows: slice,
        best: list[int | None],
        drawn: int | None,
        step: StepRows,
    ) -> None:
        """Take the request's token (``drawn``, else the greedy one) or, with drafts, the drafts
        its rows accept and the token after them (``rows``: its rows of the step)."""
        drafts = s.token_ids[1:]
        if not drafts:
            accepted, token = 0, greedy_token(best, len(best) - 1) if drawn is None else drawn
        elif req.params.is_greedy:
            accepted, token = verify_greedy_tokens(best, drafts)
        else:
            assert req.generator is not None
            target = step.target(rows, req.params, req.request_id)
            accepted, token = verify_rejection(target, req.draft_probs, drafts, req.generator)
        req.num_accepted_drafts = accepted
        req.num_computed += 1 + accepted
        if drafts and req.slot is not None:
            self.runner.crop(req.slot, req.num_computed)
        self.stats.draft_tokens += len(drafts)
        self.stats.accepted_draft_tokens += accepted
        self._append(req, [*drafts[:accepted], token])

    def _finish_complete(self, req: Request) -> None:
        """Finish at a stop token: ``stop``, or ``length`` when budget-aware closing forced
        its end (the output is complete; ``closed_from`` says where the forcing began),
        unless the output breaks its JSON schema (a schema its backend only approximates),
        which ends ``grammar_error`` naming where."""
        guide = req.params.guided_decoding
        if guide is not None:
            text = self.tokenizer.decode(content_ids(self.reasoning, req))
            problem = self.validator.problem(guide, text)
            if problem is not None:
                self.stats.invalid_outputs += 1
                req.finish("grammar_error", f"request {req.request_id}: {problem}")
                return
        if req.forced_from is not None:
            req.closed = True
            req.finish("length")
            return
        req.finish("stop")

    def _append(self, req: Request, tokens: Sequence[int]) -> None:
        """Add sampled tokens, finishing at a stop token (the tokenizer's or the request's
        ``stop_token_ids``), ``max_tokens`` or the end of the model's context."""
        stops = (*self.tokenizer.stop_token_ids, *(req.params.stop_token_ids or ()))
        for token in tokens:
            if req.thinking:
                assert self.reasoning is not None
                token = thinking_token(self.reasoning, req, token, stops)
            if token in stops:
                self._finish_complete(req)
                return
            req.output_token_ids.append(token)
            self.stats.generated_tokens += 1
            if req.params.stop and not req.thinking and self._stopped_by_string(req):
                return
            if req.broken is not None:  # a settled value breaks the schema: no way back
                self.stats.invalid_outputs += 1
                req.finish("grammar_error", f"request {req.request_id}: {req.broken}")
                return
            full = len(req.all_token_ids) >= self.max_model_len
            if len(req.output_token_ids) >= req.params.max_tokens or full:
                req.finish("length")
                return

    def _stopped_by_string(self, req: Request) -> bool:
        """Finish ``stop`` where the output first contains one of its ``stop`` strings."""
        stops = req.params.stop
        assert isinstance(stops, tuple)
        content = content_ids(self.reasoning, req)
        if not content:
            return False
        end = stop_string_start(self.tokenizer, content, stops)
        if end is None:
            return False
        req.text_end = end
        if req.params.guided_decoding is not None:
            req.incomplete = (
                "a stop string ended the guided output; the text before it was not checked "
                "against the guide"
            )
        req.finish("stop")
        return True

    def _speculate(self, batch: list[Scheduled], decoder: GuidedDecoder | None) -> dict[int, str]:
        if self.speculator is None:
            return {}
        start = time.perf_counter()
        failures = dict(self.speculator.propose(batch, decoder))
        self.stats.draft_s += time.perf_counter() - start
        if isinstance(self.speculator, JumpForwardSpeculator):
            self.stats.forced_draft_tokens = self.speculator.proposed
            self.stats.accepted_forced_tokens = self.speculator.accepted
        return failures

    def _collect_finished(self, batch: list[Scheduled], failures: dict[int, str]) -> list[Request]:
        finished = []
        for s in batch:
            req = s.request
            if req.request_id in failures and not req.is_finished:
                req.finish("grammar_error", failures[req.request_id])
            if not req.is_finished and req.prefill_only and not req.in_prefill:
                self._hand_off(req)
            if req.is_finished:
                self._release(req)
                finished.append(req)
        return finished

    # --- bookkeeping ------------------------------------------------------------------------

    def _admit(self, request: Request) -> int:
        self._requests[request.request_id] = request
        self.grammars.submit(request)
        self.scheduler.add(request)
        return request.request_id

    def _release(self, request: Request) -> None:
        guided = request.params.guided_decoding is not None
        if request.finish_reason == "length" and guided and not request.closed:
            request.incomplete = self._incomplete_note(request)
        slot = self.scheduler.remove(request)
        if slot is not None:
            self.runner.free(slot)
            self.decoder.release_slot(slot)
            if self.speculator is not None:
                self.speculator.free(slot)

    def _incomplete_note(self, request: Request) -> str:
        """Why a guided output ended ``length`` with its guide not complete."""
        left = f"{request.params.max_tokens} tokens (max_tokens)"
        if len(request.all_token_ids) >= self.max_model_len:
            left = f"the model's context of {self.max_model_len} tokens"
        if request.thinking:
            return f"the output is incomplete: it reached {left} while thinking, before its guide"
        if not request.params.close_within_budget:
            return f"the output is incomplete: it reached {left} with closing off"
        return (
            f"the output is incomplete: no completion of its guide fitted in what was left of "
            f"{left}"
        )

    def _finalize(self, request: Request) -> RequestOutput:
        self._requests.pop(request.request_id, None)
        if self.reasoning is None:
            content, reasoning = request.output_token_ids, None
        else:
            thinking, content = self.reasoning.split(
                request.output_token_ids, request.reasoning_end, request.thought
            )
            reasoning = None if thinking is None else self.tokenizer.decode(thinking)
        closed_from = None
        if request.closed and request.forced_from is not None:
            # The forced tokens are the content's last ones (closing acts after thinking).
            unforced = len(content) - (len(request.output_token_ids) - request.forced_from)
            closed_from = len(self.tokenizer.decode(content[: max(unforced, 0)]))
        text = self.tokenizer.decode(content)
        guide = request.params.guided_decoding
        opener = None if guide is None else guide.answer_opener
        if opener is not None and reasoning is None:  # think_first: the thought, the value
            at = text.find(opener)
            if at > 0:
                reasoning, text = text[:at], text[at:]
                closed_from = None if closed_from is None else max(0, closed_from - at)
        return request.output(text, reasoning, closed_from)

    def _hand_off(self, req: Request) -> None:
        assert req.slot is not None
        self._handoffs[req.request_id] = Handoff.from_request(
            req, self.runner.export_cache(req.slot)
        )
        req.finish("stop")

    def _import_handoffs(self, batch: list[Scheduled]) -> None:
        for s in batch:
            req = s.request
            if req.handoff_cache is not None and req.slot is not None:
                self.runner.import_cache(req.slot, req.handoff_cache)
                req.handoff_cache = None

    def _new_request(self, prompt: TokenizedPrompt, params: SamplingParams) -> Request:
        guide = params.guided_decoding
        if guide is not None and self.disable_additional_properties:
            closed = closed_guide(guide)
            params = (
                params if closed is guide else dataclasses.replace(params, guided_decoding=closed)
            )
        request = Request(
            self._new_id(), prompt.text, prompt.token_ids, params, make_generator(params)
        )
        request.draft_generator = make_draft_generator(params)
        if self.reasoning is not None:
            request.thought = self.reasoning.thinks_at_start(prompt.token_ids)
            request.thinking = request.thought
        return request

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def close(self) -> None:
        """Stop the engine's worker threads (the build worker, the grammar pool) and its
        compile workers."""
        self.forward.close()
        self.grammars.shutdown()
        if self.config.isolation is not None:
            self.config.isolation.close()

    def _update_stats(self, t0: float, t1: float, t2: float, t3: float) -> None:
        self.stats.steps += 1
        self.stats.forward_s += t1 - t0
        self.stats.guide_s += t2 - t1
        self.stats.sample_s += t3 - t2
