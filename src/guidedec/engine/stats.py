"""The engine's timings: per step (``StepTimes``) and running totals (``EngineStats``)."""

from __future__ import annotations

from dataclasses import dataclass

STEP_TIMES_KEPT = 4096  # the most recent steps' times kept on the engine


@dataclass(slots=True)
class StepTimes:
    """Guided decoding in one engine step, in seconds.

    ``build_s``: the decoder's host build (advance matchers, fill rows); ``wait_s``: how long
    the logits waited for the mask once the forward had ended (the whole build without overlap,
    about zero with it); ``apply_s``: copy and apply.
    """

    build_s: float
    wait_s: float
    apply_s: float


@dataclass(slots=True)
class EngineStats:
    """Running totals, in seconds and tokens. ``guide_s`` is the time guided decoding added
    after the forward (``mask_wait_s + apply_s``); ``build_s`` includes any overlapped part."""

    steps: int = 0
    forward_s: float = 0.0
    guide_s: float = 0.0
    build_s: float = 0.0
    mask_wait_s: float = 0.0
    apply_s: float = 0.0
    sample_s: float = 0.0
    draft_s: float = 0.0
    generated_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    forced_draft_tokens: int = 0  # drafts jump-forward proposed (tokens the grammar forced)
    accepted_forced_tokens: int = 0  # of them, accepted by verification
    rows_without_logits: int = 0  # verification rows whose mask allowed one token: no lm_head
    rows_with_sparse_logits: int = 0  # rows whose mask allowed few tokens: lm_head at those
    invalid_outputs: int = 0  # complete outputs that broke their JSON schema (grammar_error)
    paced_requests: int = 0  # times a request's slow masks made it sit out steps (pacing)
    steps_sat_out: int = 0  # steps requests sat out, summed over the requests

    def add_step(self, start: float, forward_end: float, guide_end: float, end: float) -> None:
        """Count a step from its times: forward, then guide, then sampling."""
        self.steps += 1
        self.forward_s += forward_end - start
        self.guide_s += guide_end - forward_end
        self.sample_s += end - guide_end
