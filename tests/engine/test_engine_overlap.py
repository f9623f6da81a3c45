"""Overlap: the engine builds each step's masks while its forward runs, with the same outputs
token for token as the engine that builds them after the forward (greedy, seeded sampling,
speculative decoding on and off, both backends), and per-step times that show it."""

from __future__ import annotations

import sys

import pytest
import torch

from guidedec import LLM, GuidedDecodingParams, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}
GUIDES = [
    GuidedDecodingParams(json_schema=SCHEMA),
    GuidedDecodingParams(regex=r"(yes|no)-[0-9]{1,3}"),
    None,
]
PROMPTS = ["A record:", "Answer:", "Free text"]


def outputs(backend: str, overlap: bool, speculative: str | None, temperature: float) -> list:
    llm = LLM(
        "tiny-random",
        backend=backend,  # type: ignore[arg-type]
        max_num_seqs=3,
        speculative=speculative,
        num_draft_tokens=3,
        dtype=torch.float64,  # chunked verification must not flip an argmax
        json_whitespace="compact",
        overlap=overlap,
    )
    params = [
        SamplingParams(max_tokens=20, temperature=temperature, seed=7 + i, guided_decoding=g)
        for i, g in enumerate(GUIDES)
    ]
    results = llm.generate(PROMPTS, params)
    assert len(llm.step_times) > 0
    llm.close()
    return [(r.token_ids, r.finish_reason, r.error) for r in results]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize(
    ("speculative", "temperature"),
    [(None, 0.0), (None, 0.8), ("ngram", 0.0), ("draft:tiny-random-draft", 0.8)],
)
def test_overlapped_and_sequential_engines_agree(
    backend: str, speculative: str | None, temperature: float
) -> None:
    overlapped = outputs(backend, True, speculative, temperature)
    sequential = outputs(backend, False, speculative, temperature)
    assert overlapped == sequential
    assert any(reason == "stop" for _, reason, _ in overlapped)  # a guide ran to its end


def test_step_times_show_the_overlap() -> None:
    """Without overlap the logits wait for the whole build; with it, only for what is left of
    the build when the forward ends, which is never more."""
    for overlap in (False, True):
        # (a step that verifies jump-forward drafts builds its masks first, by design)
        llm = LLM(
            "tiny-random",
            max_num_seqs=3,
            json_whitespace="compact",
            overlap=overlap,
            jump_forward=False,
        )
        params = [SamplingParams(max_tokens=12, guided_decoding=g) for g in GUIDES]
        llm.generate(PROMPTS, params)
        times = list(llm.step_times)
        assert times and all(t.build_s > 0 and t.apply_s > 0 for t in times)
        if overlap:
            # Handing the mask back across threads takes up to a GIL switch interval.
            slack = sys.getswitchinterval() + 1e-3
            assert all(t.wait_s <= t.build_s + slack for t in times)
        else:
            assert all(t.wait_s >= t.build_s for t in times)
        stats = llm.stats
        assert stats.build_s == pytest.approx(sum(t.build_s for t in times))
        assert stats.mask_wait_s == pytest.approx(sum(t.wait_s for t in times))
        llm.close()
