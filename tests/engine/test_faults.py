"""Fault injection through ``LLM.generate``: a backend failure at every host call site a
request's matcher is reached from (the build and its timed fills, budget-aware closing's search
and checks, steering, the static graph path) fails that request alone, with ``grammar_error``
naming it; the others end exactly as alone and the engine serves on (see ``fault_sweep``)."""

from __future__ import annotations

import pytest

from fault_sweep import HEALTHY, RECORD, Scenario, sweep
from guidedec import GuidedDecodingParams, SamplingParams

# xgrammar approximates uniqueItems: the request is steered (each structural token checked).
STEERED = {
    "type": "object",
    "properties": {
        "tags": {
            "type": "array",
            "items": {"enum": ["a", "b", "c"]},
            "uniqueItems": True,
            "maxItems": 3,
        }
    },
    "required": ["tags"],
}
CLOSING = frozenset(
    {
        "guidedec.decoder.base:_close",
        "guidedec.decoder.closing.closer:admits",
        "guidedec.decoder.closing.search:_probe",
    }
)
SCENARIOS = {
    "xgrammar: closing and steering": Scenario(
        engine={"backend": "xgrammar", "jump_forward": False, "max_num_seqs": 3},
        faulty=(
            "A record:",
            SamplingParams(
                max_tokens=30, guided_decoding=GuidedDecodingParams(json_schema=STEERED)
            ),
        ),
        healthy=HEALTHY,
        reaches=CLOSING
        | {
            "guidedec.decoder.advance:running",
            "guidedec.decoder.advance:start",
            "guidedec.decoder.rows:fill_request",
        },
    ),
    "llguidance: closing, every fill timed": Scenario(
        engine={"backend": "llguidance", "jump_forward": False, "max_num_seqs": 3},
        faulty=(
            "A record:",
            SamplingParams(max_tokens=30, guided_decoding=GuidedDecodingParams(json_schema=RECORD)),
        ),
        healthy=HEALTHY,
        timed=True,
        reaches=CLOSING | {"guidedec.decoder.fill_timing:fill"},
    ),
    # The probe runs into the cycle of (ab)*: the search proper runs.
    "llguidance: closing's search": Scenario(
        engine={"backend": "llguidance", "jump_forward": False, "max_num_seqs": 3},
        faulty=(
            "Letters:",
            SamplingParams(max_tokens=30, guided_decoding=GuidedDecodingParams(regex="(ab)*c")),
        ),
        healthy=HEALTHY,
        reaches=CLOSING
        | {"guidedec.decoder.closing.search:_search", "guidedec.decoder.closing.search:_expand"},
    ),
    "llguidance: the static graph path": Scenario(
        engine={"backend": "llguidance", "cuda_graphs": True, "max_num_seqs": 3},
        faulty=(
            "A record:",
            SamplingParams(max_tokens=30, guided_decoding=GuidedDecodingParams(json_schema=RECORD)),
        ),
        healthy=HEALTHY,
        reaches=CLOSING
        | {"guidedec.decoder.advance:running", "guidedec.decoder.rows:fill_request"},
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_backend_failure_at_any_call_site_fails_its_request_alone(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep(SCENARIOS[name], monkeypatch)
