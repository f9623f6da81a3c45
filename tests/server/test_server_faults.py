"""A request whose backend fails mid-decoding, through the live server and the official ``openai``
client: it is answered with a ``grammar_error`` result naming the failure (never a 500), the
requests beside it are answered as they are alone, and the server serves on."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from fault_sweep import pin_timing
from guidedec import LLM
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.server import create_app
from guidedec.testing.faults import FAULT_TEXT, FaultPlan, inject
from live_server import serve

UNLEXABLE = {"type": "string", "pattern": "^a{1000000}$"}
"""A pattern llguidance compiles, then refuses to lex at the first token ("too many expressions
constructed"): a backend failure inside a step, in budget-aware closing's check."""
FAULTY = {
    "type": "object",
    "properties": {"tag": {"type": "string", "maxLength": 6}},
    "required": ["tag"],
}
HEALTHY = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
}
PLAN = FaultPlan()


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with pytest.MonkeyPatch.context() as patch:
        pin_timing(patch, timed=False)  # the same calls whatever the load (no timed fills)
        llm = LLM(
            "tiny-random",
            max_num_seqs=4,
            isolate_compiles=False,
            mask_time_limit_ms=None,
            disable_additional_properties=False,  # the guide stays the one the plan names
        )
        # The server's guides become GuidedDecodingParams with the schema as canonical JSON.
        inject(llm, PLAN, [GuidedDecodingParams(json_schema=FAULTY)])
        for url in serve(create_app(llm)):
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _ask(client: openai.OpenAI, schema: dict[str, Any], content: str = "Answer:") -> Any:
    return client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": content}],
        max_tokens=24,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        },
    )


def test_a_pattern_the_backend_cannot_lex_gets_a_grammar_error_not_a_500(
    client: openai.OpenAI,
) -> None:
    alone = _ask(client, HEALTHY)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_ask, client, s) for s in (HEALTHY, UNLEXABLE, HEALTHY)]
        first, hostile, last = (f.result() for f in futures)
    choice = hostile.choices[0]
    assert choice.finish_reason == "grammar_error"
    assert "too many expressions" in choice.model_extra["error"]
    for answer in (first, last):
        assert answer.choices[0].finish_reason == alone.choices[0].finish_reason
        assert answer.choices[0].message.content == alone.choices[0].message.content
    stream = client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "Answer:"}],
        max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": UNLEXABLE}},
        stream=True,
    )
    reasons = [c.choices[0].finish_reason for c in stream if c.choices]
    assert reasons[-1] == "grammar_error"
    assert _ask(client, HEALTHY).choices[0].message.content == alone.choices[0].message.content


@pytest.mark.parametrize(
    ("method", "nth"),
    [("advance_and_fill", 3), ("fill_next_token_bitmask", 1), ("accept_token", 2), ("rollback", 1)],
)
def test_a_backend_failure_mid_request_is_a_grammar_error_result(
    client: openai.OpenAI, method: str, nth: int
) -> None:
    PLAN.arm()
    alone = _ask(client, HEALTHY)
    faulty_alone = _ask(client, FAULTY, "A tag:")
    assert faulty_alone.choices[0].finish_reason in ("stop", "length")
    PLAN.arm(method, nth=nth)
    with ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(_ask, client, HEALTHY),
            pool.submit(_ask, client, FAULTY, "A tag:"),
            pool.submit(_ask, client, HEALTHY),
        ]
        first, faulty, last = (f.result() for f in futures)
    assert PLAN.fired is not None and PLAN.fired[0] == method
    assert faulty.choices[0].finish_reason == "grammar_error"
    assert FAULT_TEXT in faulty.choices[0].model_extra["error"]
    for answer in (first, last):
        assert answer.choices[0].message.content == alone.choices[0].message.content
    PLAN.arm()
    again = _ask(client, FAULTY, "A tag:")
    assert again.choices[0].message.content == faulty_alone.choices[0].message.content
