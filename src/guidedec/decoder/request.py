"""GuidedRequest: the per-step snapshot of a scheduled request that guided decoding reads.

The engine (scheduler) builds one per scheduled request and hands the batch to
``GuidedDecoder.add_batch``; the decoder never reads the engine's own request objects, so a
snapshot stays valid even when the engine has already moved the request on (as it must for CUDA
graphs, where host functions run later).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from guidedec.grammar.params import GuidedDecodingParams


@dataclass(slots=True)
class GuidedRequest:
    """One scheduled request, as guided decoding sees it in this step.

    Attributes:
        guided_decoding_params: The request's guide, or None for an unguided request.
        request_id: The engine's id, used to report failures.
        seq_slot: The sequence slot that holds the request's grammar state. For a draft request
            this is the slot of its target request (both share one matcher).
        prev_seq_slot: The request's position in the previous step's batch (read by host
            functions under CUDA graphs); None when not needed.
        is_context_init_state: The request is in its context (prefill) phase.
        is_last_context_chunk: This step processes the last chunk of its prompt.
        is_generation_in_progress_state: The request is generating.
        is_generation_only_first_iteration: A generation-only request (prefill done by another
            engine) in its first step here.
        new_token: The token sampled in the previous step (generation phase).
        is_draft: The request belongs to a drafting loop (speculative decoding).
        draft_tokens: Draft tokens proposed for verification in this step.
        num_accepted_draft_tokens: Draft tokens the target accepted in the previous step.
        tokens_left: The tokens the request may still emit, the one sampled from this row
            included (``max_tokens`` or the context, whichever ends first), for budget-aware
            closing (see :mod:`guidedec.decoder.closing`); None: no closing.
        prior_tokens: Tokens the request emitted since its last step before ``new_token``,
            written already, so not masked: fed to its matcher before ``new_token`` (an engine
            that appends several tokens in one step, or admits a request again with output it
            wrote before). Generation only, without drafts.
        refill: A generating request that emitted no token since its last step (``new_token``
            None): its row is filled again from its matcher's state (an engine that asks for
            the logits of a step whose token it did not keep). See :meth:`unchanged`.
    """

    guided_decoding_params: GuidedDecodingParams | None
    request_id: int
    seq_slot: int
    prev_seq_slot: int | None = None
    is_context_init_state: bool = False
    is_last_context_chunk: bool = False
    is_generation_in_progress_state: bool = False
    is_generation_only_first_iteration: bool = False
    new_token: int | None = None
    is_draft: bool = False
    draft_tokens: tuple[int, ...] = ()
    num_accepted_draft_tokens: int = 0
    tokens_left: int | None = None
    prior_tokens: tuple[int, ...] = ()
    refill: bool = False

    @classmethod
    def context(
        cls,
        params: GuidedDecodingParams | None,
        *,
        request_id: int,
        seq_slot: int,
        is_last_context_chunk: bool = True,
        tokens_left: int | None = None,
    ) -> GuidedRequest:
        """A request in its prefill phase (by default its last prompt chunk)."""
        return cls(
            params,
            request_id,
            seq_slot,
            is_context_init_state=True,
            is_last_context_chunk=is_last_context_chunk,
            tokens_left=tokens_left,
        )

    @classmethod
    def generation(
        cls,
        params: GuidedDecodingParams | None,
        *,
        request_id: int,
        seq_slot: int,
        new_token: int,
        draft_tokens: Sequence[int] = (),
        num_accepted_draft_tokens: int = 0,
        is_generation_only_first_iteration: bool = False,
        tokens_left: int | None = None,
        prior_tokens: Sequence[int] = (),
    ) -> GuidedRequest:
        """A generating request whose previous step sampled ``new_token`` (after
        ``prior_tokens``, when it emitted several).

        ``is_generation_only_first_iteration`` marks a request whose prefill (and first token)
        came from another engine, in its first step here: its matcher is created now.
        """
        return cls(
            params,
            request_id,
            seq_slot,
            is_generation_in_progress_state=True,
            is_generation_only_first_iteration=is_generation_only_first_iteration,
            new_token=new_token,
            draft_tokens=tuple(draft_tokens),
            num_accepted_draft_tokens=num_accepted_draft_tokens,
            tokens_left=tokens_left,
            prior_tokens=tuple(prior_tokens),
        )

    @classmethod
    def unchanged(
        cls,
        params: GuidedDecodingParams | None,
        *,
        request_id: int,
        seq_slot: int,
        tokens_left: int | None = None,
    ) -> GuidedRequest:
        """A generating request that emitted no token since its last step: its row is filled
        again where its matcher is."""
        return cls(
            params,
            request_id,
            seq_slot,
            is_generation_in_progress_state=True,
            tokens_left=tokens_left,
            refill=True,
        )

    def as_draft(self, new_token: int, num_accepted_draft_tokens: int = 0) -> GuidedRequest:
        """This request as the drafting loop sees it: same slot, ``new_token`` to advance with,
        no draft tokens of its own."""
        return replace(
            self,
            is_draft=True,
            new_token=new_token,
            draft_tokens=(),
            num_accepted_draft_tokens=num_accepted_draft_tokens,
            tokens_left=None,
            prior_tokens=(),
        )

    def require_matcher_init(self) -> bool:
        """Whether this step creates the matcher: at the last prompt chunk of a target request,
        or at the first step of a generation-only request."""
        if self.guided_decoding_params is None or self.is_draft:
            return False
        if self.is_generation_only_first_iteration:
            return True
        return self.is_context_init_state and self.is_last_context_chunk

    def require_matcher_advance(self) -> bool:
        """Whether this step advances the matcher with ``new_token``.

        A target request advances in generation. A draft request also advances at its last
        prompt chunk, where ``new_token`` is the target's first token.
        """
        if self.guided_decoding_params is None:
            return False
        if self.is_draft and self.is_context_init_state and self.is_last_context_chunk:
            return True
        return self.is_generation_in_progress_state


@dataclass(slots=True)
class GuidedRequests:
    """A batch of snapshots in logits-row order, with the bitmask rows each one owns.

    Request ``i`` owns consecutive rows starting where request ``i - 1`` ends, mirroring the rows
    of the logits tensor: a target request owns ``1 + min(len(draft_tokens), num_draft_tokens)``
    (its new-token position and one per draft token); a draft request owns one.
    ``num_draft_tokens`` is this step's draft length, at most the decoder's static maximum.
    """

    requests: list[GuidedRequest]
    num_draft_tokens: int
    offsets: list[int] = field(init=False)
    num_bitmask_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.offsets = offsets = []
        total, k = 0, self.num_draft_tokens
        for req in self.requests:  # rows_of, inline: this runs for every request of every step
            offsets.append(total)
            total += 1 if req.is_draft else 1 + min(len(req.draft_tokens), k)
        self.num_bitmask_tokens = total

    def rows_of(self, req: GuidedRequest) -> int:
        """Bitmask rows owned by ``req``."""
        if req.is_draft:
            return 1
        return 1 + len(self.drafts_of(req))

    def drafts_of(self, req: GuidedRequest) -> tuple[int, ...]:
        """The draft tokens of ``req`` that this step verifies (its first ``num_draft_tokens``)."""
        return () if req.is_draft else req.draft_tokens[: self.num_draft_tokens]

    def __len__(self) -> int:
        return len(self.requests)

    def check_fits(self, max_rows: int, num_slots: int) -> None:
        """Raise ``ValueError`` unless the batch fits a decoder of ``max_rows`` bitmask rows
        and ``num_slots`` slots, each guided request in a slot of its own."""
        if self.num_bitmask_tokens > max_rows:
            raise ValueError(
                f"batch needs {self.num_bitmask_tokens} bitmask rows; the decoder has "
                f"{max_rows} (max_num_sequences * (max_num_draft_tokens + 1))"
            )
        slots: set[int] = set()
        for req in self.requests:
            slot = req.seq_slot
            if not 0 <= slot < num_slots:
                raise ValueError(f"request {req.request_id}: seq_slot {slot} out of range")
            if slot in slots and req.guided_decoding_params is not None:
                raise ValueError(f"request {req.request_id}: seq_slot {slot} used twice")
            slots.add(slot)
            if req.prior_tokens and (
                req.is_draft or req.draft_tokens or not req.is_generation_in_progress_state
            ):
                raise ValueError(
                    f"request {req.request_id}: prior_tokens only go with a generating request "
                    "without drafts"
                )
            if req.refill and (req.new_token is not None or req.draft_tokens or req.is_draft):
                raise ValueError(
                    f"request {req.request_id}: a refill carries no new_token and no drafts"
                )

    def covered_rows(self, num_rows: int | None, max_rows: int) -> int:
        """The rows a copy or apply covers: the batch's, or ``num_rows`` (not fewer, and no more
        than the buffers' ``max_rows``)."""
        needed = self.num_bitmask_tokens
        if num_rows is None:
            return needed
        if not needed <= num_rows <= max_rows:
            raise ValueError(
                f"num_rows={num_rows} must be in [{needed}, {max_rows}] (the batch's rows, the "
                f"buffers' rows)"
            )
        return num_rows

    def valid_requests(self) -> Iterator[GuidedRequest]:
        """The guided requests."""
        return (r for r in self.requests if r.guided_decoding_params is not None)

    def valid_requests_with_offsets(self) -> Iterator[tuple[GuidedRequest, int]]:
        """The guided requests with the first bitmask row of each."""
        offsets = self.offsets
        for i, req in enumerate(self.requests):
            if req.guided_decoding_params is not None:
                yield req, offsets[i]
