"""``guidedec.LLM``: generate under grammars with a causal LM, offline.

The user-facing side of the engine: options, ``generate``, ``add_request``/``step``, and
disaggregated ``prefill``/``generate_from_handoff``. The step itself is in
:mod:`guidedec.engine.core`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from guidedec.engine.chat import Conversation, as_conversations, render_chat
from guidedec.engine.core import EngineCore, Speculator
from guidedec.engine.handoff import Handoff
from guidedec.engine.model import LoadedModel, load_model
from guidedec.engine.prompts import Prompt, check_prompt, tokenize, tokenize_prompts
from guidedec.engine.reasoning import ReasoningParser, ReasoningParserName
from guidedec.engine.request import RequestOutput
from guidedec.engine.sampling import SamplingParams
from guidedec.engine.speculative import (
    DraftModelSpeculator,
    JumpForwardSpeculator,
    NgramSpeculator,
    parse_speculative,
)
from guidedec.engine.stats import EngineStats
from guidedec.grammar.config import (
    BackendName,
    ExactBackendName,
    FillMode,
    GuidedDecodingConfig,
    WhitespaceMode,
)
from guidedec.grammar.isolation import CompileIsolation
from guidedec.grammar.limits import GuideLimits
from guidedec.tokenizer import TokenizerInfo

__all__ = ["LLM", "EngineStats"]


class LLM(EngineCore):
    """Generate under grammars with a Hugging Face causal LM or the built-in ``tiny-random``.

    Args:
        model: ``"tiny-random"`` (a seeded random Llama with the bundled tokenizer, no download),
            ``"tiny-random-draft"``, a local Hugging Face model directory, or a hub id.
        backend: Grammar backend: ``"auto"``, ``"xgrammar"`` or ``"llguidance"``.
        auto_prefers: With ``backend="auto"``, the backend tried first for a JSON guide that
            both enforce exactly (``GuidedDecodingConfig.auto_prefers``). Default
            ``"llguidance"``: its masks keep the text a grammar forces in the tokenizer's own
            split, so jump-forward's drafts of it are accepted; ``"xgrammar"`` is what the
            decoder and the vLLM plugin default to.
        max_num_seqs: Sequence slots: requests decoded together.
        max_num_tokens: Tokens one step may feed (prompt chunks plus generation tokens); longer
            prompts are prefilled in chunks. Default: ``max(2048, max_num_seqs * (1 + k))``.
        speculative: ``None``, ``"ngram"`` (prompt lookup) or ``"draft:<model>"``.
        num_draft_tokens: Draft tokens per step ``k`` when speculating (or jumping forward).
        jump_forward: Propose the tokens a guided request's grammar forces next as draft tokens,
            verified with the new token in one forward (see
            :class:`guidedec.engine.speculative.JumpForwardSpeculator`); outputs are unchanged
            (greedy: token for token). With ``speculative="ngram"`` the n-gram drafts follow
            the forced ones; not with a draft model. None (default): on, except with a draft
            model, with ``cuda_graphs`` (a step that verifies runs eagerly), or where
            ``max_num_tokens`` cannot hold ``num_draft_tokens`` drafts for every sequence.
        device, dtype: Where and in which precision the model runs (default CPU, float32).
        seed: Seed of the ``tiny-random`` weights.
        compile_timeout_s: A guide that takes longer to compile fails its request.
        json_whitespace: ``"flexible"`` (bounded runs) or ``"compact"`` JSON whitespace.
        disable_additional_properties: Close each JSON-schema object that names its properties
            to properties it does not name (default), as vLLM's option of the name, xgrammar's
            strict mode (vLLM's default guide) and OpenAI's strict schemas do (see
            :mod:`guidedec.grammar.closed_objects`); outputs stay valid under the schema as
            written, and a small model writes no extra arguments into its tool calls (see the
            docs' answer quality section). ``False``: the schema's language exactly as
            written.
        overlap: Build each step's masks while its forward runs (see
            :mod:`guidedec.engine.core`); the outputs are the same either way.
        approximate: With ``backend="auto"``, guide a JSON schema that no backend enforces
            exactly with xgrammar's approximation (``True``) or fail its request (``False``).
        cuda_graphs: Static KV caches, and each pure decode step replayed from a captured CUDA
            graph with guided decoding inside (see :mod:`guidedec.engine.core`); on the CPU the
            same static-buffer path without a graph. The outputs are the same as without
            (up to floating-point rounding in attention: use float64 to compare them exactly).
        fill_mode: How each step fills its mask rows: ``"auto"`` (whichever of the backends'
            parallel batch calls and one row at a time measures faster), ``"parallel"`` or
            ``"sequential"`` (see :mod:`guidedec.grammar.batch_fill`).
        max_model_len: The longest sequence (prompt + output) the engine takes, at most the
            model's own (default). Lower it to bound memory: with ``cuda_graphs`` every slot's
            static cache holds this many positions from the start.
        isolate_compiles: Compile each new guide first in a worker process (default), so that
            a guide that crashes a backend or passes ``compile_timeout_s`` fails its request
            alone and its compile is stopped (see :mod:`guidedec.grammar.isolation`). ``False``
            compiles in this process only: cheaper, for trusted guides (and what a daemonic
            process, such as a pool's worker, gets, since it may not start processes).
        guide_limits: Limits on a guide's size and shape (default ``GuideLimits()``; see
            :mod:`guidedec.grammar.limits`); a guide past one fails its request, naming it.
        compile_cache_dir: A directory that keeps xgrammar's compiled grammars across
            restarts, shared by processes (see :mod:`guidedec.grammar.disk_cache`).
        mask_time_limit_ms: A request whose token masks take longer than this three times in a
            row ends with ``grammar_error`` (default 20 ms; real guides take microseconds; None:
            no limit). See :class:`guidedec.grammar.config.GuidedDecodingConfig`.
        reasoning_parser: ``"deepseek_r1"`` or ``"qwen3"``: a request's output starts with the
            model's thinking, free, and its guide applies after ``</think>``; outputs carry
            it as ``reasoning`` (see :mod:`guidedec.engine.reasoning`).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "tiny-random",
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
        overlap: bool = True,
        approximate: bool = True,
        auto_prefers: ExactBackendName = "llguidance",
        cuda_graphs: bool = False,
        fill_mode: FillMode = "auto",
        max_model_len: int | None = None,
        isolate_compiles: bool = True,
        guide_limits: GuideLimits | None = None,
        mask_time_limit_ms: float | None = 20.0,
        compile_cache_dir: str | os.PathLike[str] | None = None,
        jump_forward: bool | None = None,
        reasoning_parser: ReasoningParserName | None = None,
        disable_additional_properties: bool = True,
    ) -> None:
        spec, jump_forward, k, budget = _drafting(
            speculative, jump_forward, num_draft_tokens, max_num_seqs, max_num_tokens, cuda_graphs
        )
        loaded = _load(model, device, dtype, seed, max_model_len)
        config = GuidedDecodingConfig(
            backend=backend,
            tokenizer=loaded.tokenizer,
            max_rollback_tokens=k + 1,
            json_whitespace=json_whitespace,
            approximate=approximate,
            auto_prefers=auto_prefers,  # the same with or without jump-forward
            fill_mode=fill_mode,
            limits=guide_limits or GuideLimits(),
            mask_time_limit_ms=mask_time_limit_ms,
            compile_cache_dir=None if compile_cache_dir is None else os.fspath(compile_cache_dir),
        )
        with _starting(isolate_compiles, compile_timeout_s, config) as isolation:
            super().__init__(
                loaded,
                config,
                max_num_seqs=max_num_seqs,
                max_num_tokens=budget,
                num_draft_tokens=k,
                speculator=_make_speculator(spec, loaded, max_num_seqs, k, seed, jump_forward),
                compile_timeout_s=compile_timeout_s,
                overlap=overlap,
                cuda_graphs=cuda_graphs,
                reasoning=_reasoning(reasoning_parser, loaded.tokenizer),
                isolation=isolation,
            )
        self._params: dict[int, SamplingParams] = {}  # of prefill-only requests
        self.disable_additional_properties = disable_additional_properties

    # --- public API --------------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate one output per prompt (a string or a list of token ids), in prompt order."""
        pairs = tokenize_prompts(prompts, sampling_params, self.tokenizer, self.max_model_len)
        return self._run([self._admit(self._new_request(p, s)) for p, s in pairs])

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to each conversation, in order, as vLLM's
        ``LLM.chat``: ``messages`` is one conversation (a list of ``{"role", "content"}``
        messages) or a list of them, each rendered through the model's chat template (or
        ``chat_template``, with ``chat_template_kwargs`` and ``tools`` passed to it; see
        :func:`guidedec.engine.chat.render_chat`), then generated as :meth:`generate` does.

        Raises:
            ValueError: a malformed message, or as :meth:`generate`.
        """
        prompts = [
            render_chat(
                conversation,
                self.tokenizer.hf_tokenizer,
                chat_template=chat_template,
                chat_template_kwargs=chat_template_kwargs,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
            )
            for conversation in as_conversations(messages)
        ]
        return self.generate(prompts, sampling_params)

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id. ``step`` advances it."""
        tokenized = tokenize(prompt, self.tokenizer)
        check_prompt("the prompt", tokenized, self.tokenizer.vocab_size, self.max_model_len)
        return self._admit(self._new_request(tokenized, params or SamplingParams()))

    def prefill(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Handoff]:
        """Prefill each prompt and sample its first token, then hand the request over: the
        handoff carries the KV cache, the first token and the request's state, for
        ``generate_from_handoff`` on another engine (disaggregated serving)."""
        ids = []
        for prompt, params in tokenize_prompts(
            prompts, sampling_params, self.tokenizer, self.max_model_len
        ):
            request = self._new_request(prompt, params)
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

    def _run(self, ids: list[int]) -> list[RequestOutput]:
        outputs: dict[int, RequestOutput] = {}
        wanted = set(ids)
        while not wanted <= outputs.keys():
            for output in self.step():
                outputs[output.request_id] = output
        return [outputs.pop(i) for i in ids]


def _load(
    name: str | os.PathLike[str],
    device: str | torch.device | None,
    dtype: torch.dtype | str | None,
    seed: int,
    max_model_len: int | None,
) -> LoadedModel:
    """The model, its context cut to ``max_model_len`` where that is given."""
    model = load_model(os.fspath(name), device=device, dtype=dtype, seed=seed)
    if max_model_len is None:
        return model
    if not 2 <= max_model_len <= model.max_model_len:
        raise ValueError(
            f"max_model_len must be in [2, {model.max_model_len}] (the model's own), "
            f"got {max_model_len}"
        )
    return dataclasses.replace(model, max_model_len=max_model_len)


def _drafting(
    speculative: str | None,
    jump_forward: bool | None,
    num_draft_tokens: int,
    max_num_seqs: int,
    max_num_tokens: int | None,
    cuda_graphs: bool,
) -> tuple[tuple[str, str | None] | None, bool, int, int]:
    """The drafter (:func:`parse_speculative`), whether jump-forward is on, the draft tokens per
    sequence (0: no drafting) and the step's token budget. Jump-forward defaults on, unless a
    draft model drafts, graphs are to be replayed or the budget cannot hold the drafts."""
    spec = parse_speculative(speculative)
    if jump_forward is None:
        roomy = max_num_tokens is None or max_num_tokens >= max_num_seqs * (1 + num_draft_tokens)
        jump_forward = (spec is None or spec[0] == "ngram") and not cuda_graphs and roomy
    if jump_forward and spec is not None and spec[0] != "ngram":
        raise ValueError("jump_forward works alone or with speculative='ngram', not a draft model")
    if (spec or jump_forward) and num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    k = num_draft_tokens if spec or jump_forward else 0
    return spec, jump_forward, k, _token_budget(max_num_tokens, max_num_seqs, k)


def _compile_isolation(isolate: bool, timeout_s: float) -> CompileIsolation | None:
    """The engine's compile workers, unless turned off or in a daemonic process (a worker of
    a pool), which may not start processes of its own."""
    if not isolate or multiprocessing.current_process().daemon:
        return None
    return CompileIsolation(timeout_s=timeout_s)


@contextlib.contextmanager
def _starting(
    isolate: bool, timeout_s: float, config: GuidedDecodingConfig
) -> Iterator[CompileIsolation | None]:
    """The engine's compile workers (see :func:`_compile_isolation`), started (the first engine
    of a process: a fork server, seconds) while the body builds the engine and waited for after
    it, so that no request's compile timeout runs during their start."""
    isolation = _compile_isolation(isolate, timeout_s)
    thread = None
    if isolation is not None:
        thread = isolation.start_in_background(config)
    yield isolation
    if thread is not None:
        thread.join()


def _reasoning(
    name: ReasoningParserName | None, tokenizer: TokenizerInfo
) -> ReasoningParser | None:
    return None if name is None else ReasoningParser.create(name, tokenizer)


def _token_budget(max_num_tokens: int | None, max_num_seqs: int, k: int) -> int:
    needed = max_num_seqs * (1 + k)
    budget = max_num_tokens or max(2048, needed)
    if budget < needed:
        raise ValueError(
            f"max_num_tokens={budget} cannot hold a generation step of {max_num_seqs} "
            f"sequences with {k} draft tokens each ({needed} tokens)"
        )
    return budget


def _make_speculator(
    spec: tuple[str, str | None] | None,
    target: LoadedModel,
    max_num_seqs: int,
    k: int,
    seed: int,
    jump_forward: bool = False,
) -> Speculator | None:
    if jump_forward:
        return JumpForwardSpeculator(k, target.max_model_len, ngram=spec is not None)
    if spec is None:
        return None
    if spec[0] == "ngram":
        return NgramSpeculator(k, target.max_model_len)
    assert spec[1] is not None
    draft = load_model(spec[1], device=target.device, dtype=target.dtype, seed=seed)
    if draft.tokenizer.vocab_size != target.tokenizer.vocab_size:
        raise ValueError(
            f"draft model {spec[1]!r} has vocab {draft.tokenizer.vocab_size}; the target has "
            f"{target.tokenizer.vocab_size}: they must share a tokenizer"
        )
    return DraftModelSpeculator(
        draft, max_num_seqs=max_num_seqs, num_draft_tokens=k, max_model_len=target.max_model_len
    )
