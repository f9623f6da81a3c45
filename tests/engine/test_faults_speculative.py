"""Fault injection with drafts: a backend failure at every host call site of speculative
decoding (verification rows, rollbacks of rejected drafts, a draft model's loop, jump-forward's
forced tokens, parallel fill waves) fails that request alone, with ``grammar_error`` naming it;
the others end exactly as alone and the engine serves on (see ``fault_sweep``)."""

from __future__ import annotations

import pytest

from fault_sweep import HEALTHY, RECORD, Scenario, sweep
from guidedec import GuidedDecodingParams, SamplingParams

# Closing off: a request proposes no drafts where closing may act (its last window of tokens).
FAULTY = (
    "A record: [1, 2, 3] [1, 2, 3] [1, 2, 3]",
    SamplingParams(
        max_tokens=32,
        guided_decoding=GuidedDecodingParams(json_schema=RECORD),
        close_within_budget=False,
    ),
)
SCENARIOS = {
    "llguidance: jump-forward and n-grams": Scenario(
        engine={"backend": "llguidance", "jump_forward": True, "speculative": "ngram"},
        faulty=FAULTY,
        healthy=HEALTHY,
        reaches=frozenset(
            {
                "guidedec.decoder.decoder:forced_tokens",
                "guidedec.decoder.rows:fill_request",
            }
        ),
    ),
    "xgrammar: a draft model": Scenario(
        engine={"backend": "xgrammar", "speculative": "draft:tiny-random-draft"},
        faulty=FAULTY,
        healthy=HEALTHY,
        reaches=frozenset(
            {
                "guidedec.decoder.advance:_accept",
                "guidedec.decoder.rows:fill_request",
                "guidedec.decoder.decoder:_rollback_rejected",
                "guidedec.decoder.decoder:rollback_draft_tokens",
            }
        ),
    ),
    "llguidance: parallel fill waves": Scenario(
        engine={"backend": "llguidance", "fill_mode": "parallel", "max_num_seqs": 6},
        faulty=FAULTY,
        healthy=[*HEALTHY, *HEALTHY[:1] * 3],
        reaches=frozenset({"guidedec.decoder.rows:fill_wave", "guidedec.decoder.rows:_after_fill"}),
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_backend_failure_with_drafts_fails_its_request_alone(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep(SCENARIOS[name], monkeypatch)
