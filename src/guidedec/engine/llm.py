"""``guidedec.LLM``: a lean engine that generates under grammars, offline.

One step: schedule (continuous batching, chunked prefill) -> forward -> mask the logits with the
guided decoder -> sample (or verify drafts) -> finish the requests the decoder reported failed ->
post-process (stop tokens, ``max_tokens``) -> propose the next drafts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from guidedec.decoder import GuidedDecoder, GuidedRequest
from guidedec.engine.grammar_pool import GrammarPool
from guidedec.engine.handoff import Handoff
from guidedec.engine.model import load_model
from guidedec.engine.request import Request, RequestOutput
from guidedec.engine.runner import ForwardInput, ModelRunner
from guidedec.engine.sampling import (
    SamplingParams,
    make_generator,
    processed_probs,
    sample,
    verify_greedy,
    verify_rejection,
)
from guidedec.engine.scheduler import Scheduled, Scheduler
from guidedec.engine.speculative import (
    DraftModelSpeculator,
    NgramSpeculator,
    parse_speculative,
)
from guidedec.grammar.config import BackendName, GuidedDecodingConfig, WhitespaceMode
from guidedec.grammar.factory import create_grammar_matcher_factory

Prompt = str | Sequence[int]


@dataclass(slots=True)
class EngineStats:
    """Running totals, in seconds and tokens."""

    steps: int = 0
    forward_s: float = 0.0
    guide_s: float = 0.0
    sample_s: float = 0.0
    draft_s: float = 0.0
    generated_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


class LLM:
    """Generate under grammars with a Hugging Face causal LM or the built-in ``tiny-random``.

    Args:
        model: ``"tiny-random"`` (a seeded random Llama with the bundled tokenizer, no download),
            ``"tiny-random-draft"``, a local Hugging Face model directory, or a hub id.
        backend: Grammar backend: ``"auto"``, ``"xgrammar"`` or ``"llguidance"``.
        max_num_seqs: Sequence slots: requests decoded together.
        max_num_tokens: Tokens one step may feed (prompt chunks plus generation tokens); longer
            prompts are prefilled in chunks. Default: ``max(2048, max_num_seqs * (1 + k))``.
        speculative: ``None``, ``"ngram"`` (prompt lookup) or ``"draft:<model>"``.
        num_draft_tokens: Draft tokens per step ``k`` when speculating.
        device, dtype: Where and in which precision the model runs (default CPU, float32).
        seed: Seed of the ``tiny-random`` weights.
        compile_timeout_s: A guide that takes longer to compile fails its request.
        json_whitespace: ``"flexible"`` (bounded runs) or ``"compact"`` JSON whitespace.
    """

    def __init__(
        self,
        model: str = "tiny-random",
        *,
        backend: BackendName = "auto",
        max_num_seqs: int = 8,
        max_num_tokens: int | None = None,
        speculative: str | None = None,
        num_draft_tokens: int = 4,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        seed: int = 0,
        compile_timeout_s: float = 60.0,
        json_whitespace: WhitespaceMode = "flexible",
    ) -> None:
        spec = parse_speculative(speculative)
        self.num_draft_tokens = num_draft_tokens if spec else 0
        if spec and num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        min_tokens = max_num_seqs * (1 + self.num_draft_tokens)
        self.max_num_tokens = max_num_tokens or max(2048, min_tokens)
        if self.max_num_tokens < min_tokens:
            raise ValueError(
                f"max_num_tokens={self.max_num_tokens} cannot hold a generation step of "
                f"{max_num_seqs} sequences with {self.num_draft_tokens} draft tokens ({min_tokens})"
            )
        self.model = load_model(model, device=device, dtype=dtype, seed=seed)
        self.tokenizer = self.model.tokenizer
        self.config = GuidedDecodingConfig(
            backend=backend,
            tokenizer=self.tokenizer,
            max_rollback_tokens=self.num_draft_tokens + 1,
            json_whitespace=json_whitespace,
        )
        self.factory = create_grammar_matcher_factory(self.config)
        self.runner = ModelRunner(self.model, max_num_seqs=max_num_seqs)
        self.decoder = GuidedDecoder(
            config=self.config,
            max_num_sequences=max_num_seqs,
            max_num_draft_tokens=self.num_draft_tokens,
            vocab_size=self.tokenizer.vocab_size,
            device=self.model.device,
            factory=self.factory,
        )
        self.scheduler = Scheduler(max_num_seqs=max_num_seqs, max_num_tokens=self.max_num_tokens)
        self.grammars = GrammarPool(self.factory, timeout_s=compile_timeout_s)
        self.speculator = self._make_speculator(spec, max_num_seqs, device, dtype, seed)
        self.stats = EngineStats()
        self._requests: dict[int, Request] = {}
        self._next_id = 0
        self._handoffs: dict[int, Handoff] = {}
        self._params: dict[int, SamplingParams] = {}  # of prefill-only requests
        self._unreported: list[Request] = []  # finished outside a step (aborted)

    def _make_speculator(
        self,
        spec: tuple[str, str | None] | None,
        max_num_seqs: int,
        device: str | torch.device | None,
        dtype: torch.dtype | str | None,
        seed: int,
    ) -> NgramSpeculator | DraftModelSpeculator | None:
        if spec is None:
            return None
        max_len = self.model.max_model_len
        if spec[0] == "ngram":
            return NgramSpeculator(self.num_draft_tokens, max_len)
        assert spec[1] is not None
        draft = load_model(spec[1], device=device, dtype=dtype, seed=seed + 1)
        if draft.tokenizer.vocab_size != self.tokenizer.vocab_size:
            raise ValueError(
                f"draft model {spec[1]!r} has vocab {draft.tokenizer.vocab_size}; the target "
                f"has {self.tokenizer.vocab_size}: they must share a tokenizer"
            )
        return DraftModelSpeculator(
            draft,
            max_num_seqs=max_num_seqs,
            num_draft_tokens=self.num_draft_tokens,
            max_model_len=max_len,
        )

    # --- public API --------------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate one output per prompt (a string or a list of token ids), in prompt order."""
        ids = [self.add_request(p, s) for p, s in self._pair(prompts, sampling_params)]
        return self._run(ids)

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id. ``step`` advances it."""
        params = params or SamplingParams()
        text, token_ids = self._tokenize(prompt)
        request = Request(self._new_id(), text, token_ids, params, make_generator(params))
        return self._admit(request)

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests that finished in it."""
        finished = [*self._unreported, *self.grammars.poll()]
        self._unreported.clear()
        for request in finished:
            self._release(request)
        batch = self.scheduler.schedule()
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

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def prefill(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Handoff]:
        """Prefill each prompt and sample its first token, then hand the request over: the
        handoff carries the KV cache, the first token and the request's state, for
        ``generate_from_handoff`` on another engine (disaggregated serving)."""
        ids = []
        for prompt, params in self._pair(prompts, sampling_params):
            text, token_ids = self._tokenize(prompt)
            request = Request(self._new_id(), text, token_ids, params, make_generator(params))
            request.prefill_only = True
            self._params[request.request_id] = params
            ids.append(self._admit(request))
        handoffs = []
        for output in self._run(ids):
            params = self._params.pop(output.request_id)
            handoff = self._handoffs.pop(output.request_id, None)
            handoffs.append(handoff or Handoff.finished(output, params))
        return handoffs

    def generate_from_handoff(self, handoffs: Sequence[Handoff]) -> list[RequestOutput]:
        """Continue requests prefilled by another engine's ``prefill``, in order."""
        ids = [None if h.output else self._admit(h.to_request(self._new_id())) for h in handoffs]
        outputs = iter(self._run([i for i in ids if i is not None]))
        return [h.output or next(outputs) for h in handoffs]

    # --- the step -----------------------------------------------------------------------------

    def _run_batch(self, batch: list[Scheduled]) -> list[Request]:
        self._import_handoffs(batch)
        t0 = time.perf_counter()
        inputs = [ForwardInput(_slot(s), s.token_ids, s.num_logits) for s in batch]
        logits = self.runner.forward(inputs)
        t1 = time.perf_counter()
        decoder = self._guide(batch)
        failures = dict(decoder.execute(logits)) if decoder else {}
        t2 = time.perf_counter()
        self._advance(batch, logits, failures)
        t3 = time.perf_counter()
        failures.update(self._speculate(batch, decoder))
        self._update_stats(t0, t1, t2, t3)
        return self._collect_finished(batch, failures)

    def _guide(self, batch: list[Scheduled]) -> GuidedDecoder | None:
        """Snapshot the batch for the decoder; None when no request in it is guided."""
        if all(s.request.params.guided_decoding is None for s in batch):
            return None
        snapshots = [_snapshot(s) for s in batch]
        self.decoder.add_batch(snapshots, num_draft_tokens=self.num_draft_tokens)
        return self.decoder

    def _advance(
        self, batch: list[Scheduled], logits: torch.Tensor, failures: dict[int, str]
    ) -> None:
        row = 0
        for s in batch:
            rows, row = logits[row : row + s.num_logits], row + s.num_logits
            req = s.request
            req.num_accepted_drafts = 0
            if req.request_id in failures:
                req.finish("grammar_error", failures[req.request_id])
            elif s.is_prefill:
                req.num_computed += len(s.token_ids)
                if s.is_last_chunk:
                    self._append(req, sample(rows, [req.params], [req.generator]))
                    req.metrics.first_token = time.perf_counter()
            else:
                self._verify(req, s, rows)
            req.generation_only_first = False

    def _verify(self, req: Request, s: Scheduled, rows: torch.Tensor) -> None:
        drafts = s.token_ids[1:]
        if req.params.is_greedy or not drafts:
            if drafts:
                accepted, token = verify_greedy(rows, drafts)
            else:
                accepted, token = 0, sample(rows, [req.params], [req.generator])[0]
        else:
            assert req.generator is not None
            probs = processed_probs(rows, req.params)
            accepted, token = verify_rejection(probs, req.draft_probs, drafts, req.generator)
        req.num_accepted_drafts = accepted
        req.num_computed += 1 + accepted
        if drafts and req.slot is not None:
            self.runner.crop(req.slot, req.num_computed)
        self.stats.draft_tokens += len(drafts)
        self.stats.accepted_draft_tokens += accepted
        self._append(req, [*drafts[:accepted], token])

    def _append(self, req: Request, tokens: Sequence[int]) -> None:
        """Add sampled tokens, finishing at a stop token, ``max_tokens`` or the context end."""
        stops = req.params.stop_token_ids or self.tokenizer.stop_token_ids
        for token in tokens:
            if token in stops:
                req.finish("stop")
                return
            req.output_token_ids.append(token)
            self.stats.generated_tokens += 1
            full = len(req.all_token_ids) >= self.model.max_model_len
            if len(req.output_token_ids) >= req.params.max_tokens or full:
                req.finish("length")
                return

    def _speculate(self, batch: list[Scheduled], decoder: GuidedDecoder | None) -> dict[int, str]:
        if self.speculator is None:
            return {}
        start = time.perf_counter()
        failures = dict(self.speculator.propose(batch, decoder))
        self.stats.draft_s += time.perf_counter() - start
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

    def _run(self, ids: list[int]) -> list[RequestOutput]:
        outputs: dict[int, RequestOutput] = {}
        wanted = set(ids)
        while not wanted <= outputs.keys():
            for output in self.step():
                outputs[output.request_id] = output
        return [outputs.pop(i) for i in ids]

    def _admit(self, request: Request) -> int:
        self._requests[request.request_id] = request
        self.grammars.submit(request)
        self.scheduler.add(request)
        return request.request_id

    def _release(self, request: Request) -> None:
        slot = self.scheduler.remove(request)
        if slot is not None:
            self.runner.free(slot)
            self.decoder.release_slot(slot)
            if self.speculator is not None:
                self.speculator.free(slot)

    def _finalize(self, request: Request) -> RequestOutput:
        self._requests.pop(request.request_id, None)
        return request.output(self.tokenizer.decode(request.output_token_ids))

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

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        return None, [int(t) for t in prompt]

    def _pair(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> Iterator[tuple[Prompt, SamplingParams]]:
        items = _as_prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            plist = [params or SamplingParams()] * len(items)
        else:
            plist = list(params)
        if len(plist) != len(items):
            raise ValueError(f"{len(items)} prompts but {len(plist)} sampling params")
        for i, (prompt, p) in enumerate(zip(items, plist, strict=True)):
            self._check_prompt(i, prompt)
            yield prompt, p

    def _check_prompt(self, index: int, prompt: Prompt) -> None:
        _, token_ids = self._tokenize(prompt)
        if not token_ids:
            raise ValueError(f"prompt {index} is empty")
        if len(token_ids) >= self.model.max_model_len:
            raise ValueError(
                f"prompt {index} has {len(token_ids)} tokens; the model takes at most "
                f"{self.model.max_model_len} (prompt and output together)"
            )

    def _update_stats(self, t0: float, t1: float, t2: float, t3: float) -> None:
        self.stats.steps += 1
        self.stats.forward_s += t1 - t0
        self.stats.guide_s += t2 - t1
        self.stats.sample_s += t3 - t2


def _slot(s: Scheduled) -> int:
    assert s.request.slot is not None
    return s.request.slot


def _snapshot(s: Scheduled) -> GuidedRequest:
    req = s.request
    assert req.slot is not None
    params = req.params.guided_decoding
    if s.is_prefill:
        return GuidedRequest.context(
            params,
            request_id=req.request_id,
            seq_slot=req.slot,
            is_last_context_chunk=s.is_last_chunk,
        )
    return GuidedRequest.generation(
        params,
        request_id=req.request_id,
        seq_slot=req.slot,
        new_token=s.token_ids[0],
        draft_tokens=s.token_ids[1:],
        is_generation_only_first_iteration=req.generation_only_first,
    )


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A prompt, a list of token ids, or a list of either, as a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    items: list[object] = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [[t for t in items if isinstance(t, int)]]  # one prompt as token ids
    for i, item in enumerate(items):
        if not isinstance(item, str | Sequence) or isinstance(item, bytes):
            raise ValueError(f"prompt {i} must be a string or a list of token ids")
    return items  # type: ignore[return-value]
