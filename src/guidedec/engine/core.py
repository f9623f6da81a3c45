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
import time

from guidedec.decoder import GuidedDecoder
from guidedec.decoder.capturable import CapturableGuidedDecoder
from guidedec.engine.batched_runner import BatchedModelRunner
from guidedec.engine.grammar_pool import GrammarPool
from guidedec.engine.graphs import DecodeGraphs
from guidedec.engine.handoff import Handoff, import_caches
from guidedec.engine.logprobs import TokenLogprob
from guidedec.engine.masked_forward import MaskedForward, StepRows
from guidedec.engine.model import LoadedModel
from guidedec.engine.outputs import Outputs
from guidedec.engine.pacing import Pacer
from guidedec.engine.prompts import TokenizedPrompt
from guidedec.engine.reasoning import ReasoningParser
from guidedec.engine.request import Request, RequestOutput
from guidedec.engine.runner import SlotRunner
from guidedec.engine.sampling import (
    SamplingParams,
    greedy_token,
    greedy_tokens,
    make_draft_generator,
    make_generator,
)
from guidedec.engine.scheduler import Scheduled, Scheduler
from guidedec.engine.speculative import (
    DraftModelSpeculator,
    JumpForwardSpeculator,
    NgramSpeculator,
)
from guidedec.engine.stats import EngineStats
from guidedec.engine.steering import SampledChecks, ValueSteering
from guidedec.engine.validation import OutputValidator
from guidedec.engine.verification import verify_greedy_tokens, verify_rejection
from guidedec.grammar.closed_objects import closed_guide
from guidedec.grammar.config import CompileProbe, GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcherFactory

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
        isolation: CompileProbe | None = None,
    ) -> None:
        self.model, self.config = model, config
        self.reasoning = reasoning
        self.tokenizer = model.tokenizer
        self.max_model_len = model.max_model_len
        self.num_draft_tokens, self.max_num_tokens = num_draft_tokens, max_num_tokens
        self.factory = create_grammar_matcher_factory(config, isolation=isolation)
        self.cuda_graphs = cuda_graphs
        self.graphs: DecodeGraphs | None = None
        runner = BatchedModelRunner(model, max_num_seqs=max_num_seqs, static=cuda_graphs)
        self.decoder = _engine_decoder(self.factory, config, max_num_seqs, num_draft_tokens, model)
        if cuda_graphs and speculator is None:  # decode steps replay; the rest run eagerly
            self.graphs = DecodeGraphs(runner, CapturableGuidedDecoder(self.decoder))
        self.scheduler = Scheduler(max_num_seqs=max_num_seqs, max_num_tokens=max_num_tokens)
        self.grammars = GrammarPool(self.factory, timeout_s=compile_timeout_s)
        self.speculator = speculator
        self.stats = EngineStats()
        self.validator = OutputValidator()
        self.steering = ValueSteering(self.validator, self.decoder.token_checks.structural)
        self.checks = SampledChecks(
            self.decoder.token_checks, self.steering, self.tokenizer, self.max_model_len
        )
        self.outputs = Outputs(
            self.tokenizer, self.max_model_len, reasoning, self.validator, self.stats
        )
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
        self.pacer = Pacer()  # slow masks sit out steps (see guidedec.engine.pacing)

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
        import_caches(batch, self.runner)
        t0 = time.perf_counter()
        step = self.forward.run(batch)
        self._advance(batch, step)
        t3 = time.perf_counter()
        if self.graphs is None:  # a replay's build is not timed; a slow mask inflates the work
            times = step.decoder.fill_times() if step.decoder is not None else {}
            work_s = self.forward.forward_s + (t3 - step.guide_end)
            self.stats.paced_requests += self.pacer.after_step(batch, times, work_s)
        failures = step.failures
        failures.update(self._speculate(batch, step.decoder))
        self.stats.add_step(t0, step.forward_end, step.guide_end, t3)
        return self._collect_finished(batch, failures)

    def _advance(self, batch: list[Scheduled], step: StepRows) -> None:
        """Sample or verify each request's tokens from the step's rows, checked, and append
        them (a request the guide failed finishes ``grammar_error``)."""
        logits, failures = step.logits, step.failures
        # One pass over every row for the greedy requests; none when every request samples.
        if any(s.request.params.is_greedy for s in batch):
            best = greedy_tokens(logits)
        else:
            best = [None] * logits.shape[0]
        drawn = step.draw(batch)  # the sampling requests
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
                    token = self.checks.check(req, rows.stop - 1, token, step)
                    if token is not None:
                        self.outputs.append(req, [token])
                    req.metrics.first_token = time.perf_counter()
            else:
                token = drawn.get(req.request_id)
                if len(s.token_ids) == 1:  # no drafts: the one token, checked for closing
                    token = greedy_token(best, rows.stop - 1) if token is None else token
                    token = self.checks.check(req, rows.stop - 1, token, step)
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
        self.outputs.append(req, [*drafts[:accepted], token])

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
            request.incomplete = self.outputs.incomplete_note(request)
        slot = self.scheduler.remove(request)
        if slot is not None:
            self.runner.free(slot)
            self.decoder.release_slot(slot)
            if self.speculator is not None:
                self.speculator.free(slot)

    def _finalize(self, request: Request) -> RequestOutput:
        self._requests.pop(request.request_id, None)
        return self.outputs.output(request)

    def _hand_off(self, req: Request) -> None:
        assert req.slot is not None
        self._handoffs[req.request_id] = Handoff.from_request(
            req, self.runner.export_cache(req.slot)
        )
        req.finish("stop")

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
        self.factory.close()


def _engine_decoder(
    factory: GrammarMatcherFactory,
    config: GuidedDecodingConfig,
    max_num_seqs: int,
    num_draft_tokens: int,
    model: LoadedModel,
) -> GuidedDecoder:
    """The engine's decoder, its tokenizer tables built: the backends' and closing's, ~1 s
    each of Python that holds the GIL, now rather than beside the first guided requests' steps
    (they would stall every request)."""
    decoder = GuidedDecoder(
        config=config,
        factory=factory,
        max_num_sequences=max_num_seqs,
        max_num_draft_tokens=num_draft_tokens,
        device=model.device,
        closing_margin=0,  # the engine checks each sampled token: no row is forced
    )
    factory.warm_up()
    decoder.warm_up()
    return decoder
