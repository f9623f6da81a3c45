"""GuidedLogitsProcessor inside transformers' generate (plain, batched, assisted) and called
directly (sync after rollback, vocabulary width, finished rows, errors)."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import jsonschema
import pytest
import torch
from transformers import LogitsProcessorList

from guidedec import GuidedDecodingParams, TokenizerInfo
from guidedec.engine.model import TINY_RANDOM, TINY_RANDOM_DRAFT, LoadedModel, load_model
from guidedec.integrations.transformers import GuidedLogitsProcessor

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON = GuidedDecodingParams(json_schema=SCHEMA)
REGEX = r"[a-z]{3}-\d{2}"
CHOICES = ["yes", "no way"]
PROMPTS = ["Give me a person as JSON:", "Hi"]


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    return load_model(TINY_RANDOM)


@pytest.fixture(scope="module")
def tok(lm: LoadedModel) -> TokenizerInfo:
    return lm.tokenizer


def _encode(tok: TokenizerInfo, prompts: list[str]) -> dict[str, torch.Tensor]:
    hf = tok.hf_tokenizer
    hf.padding_side = "left"
    return dict(hf(prompts, return_tensors="pt", padding=True))


def _generate(
    lm: LoadedModel, inputs: dict[str, torch.Tensor], proc: Any, **kwargs: Any
) -> list[list[int]]:
    """Greedy generation; the generated tokens of each row, cut after the first EOS."""
    procs = LogitsProcessorList([proc] if proc is not None else [])
    out = lm.model.generate(
        **inputs,
        logits_processor=procs,
        max_new_tokens=kwargs.pop("max_new_tokens", 40),
        do_sample=False,
        pad_token_id=lm.tokenizer.hf_tokenizer.pad_token_id,
        eos_token_id=lm.tokenizer.eos_token_id,
        **kwargs,
    )
    rows: list[list[int]] = out[:, inputs["input_ids"].shape[1] :].tolist()
    return [_cut(row, lm.tokenizer.eos_token_id) for row in rows]


def _cut(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


def _text(tok: TokenizerInfo, row: list[int]) -> str:
    assert row and row[-1] == tok.eos_token_id, f"row did not end with EOS: {row}"
    return tok.decode(row[:-1])


def test_json_schema_batch_with_left_padding(lm: LoadedModel, tok: TokenizerInfo) -> None:
    inputs = _encode(tok, PROMPTS)
    assert inputs["attention_mask"][1, 0] == 0  # the second prompt is left-padded
    proc = GuidedLogitsProcessor(JSON, tok, json_whitespace="compact")
    for row in _generate(lm, inputs, proc):
        jsonschema.validate(json.loads(_text(tok, row)), SCHEMA)


def test_one_guide_per_row(lm: LoadedModel, tok: TokenizerInfo) -> None:
    guides = [GuidedDecodingParams(regex=REGEX), GuidedDecodingParams(choice=CHOICES)]
    proc = GuidedLogitsProcessor(guides, tok)
    first, second = _generate(lm, _encode(tok, PROMPTS), proc)
    assert re.fullmatch(REGEX, _text(tok, first), re.ASCII)
    assert _text(tok, second) in CHOICES


def test_unguided_row_is_untouched(lm: LoadedModel, tok: TokenizerInfo) -> None:
    inputs = _encode(tok, PROMPTS)
    plain = _generate(lm, inputs, None, max_new_tokens=12)
    proc = GuidedLogitsProcessor([GuidedDecodingParams(regex=REGEX), None], tok)
    guided = _generate(lm, inputs, proc, max_new_tokens=12)
    assert guided[1] == plain[1]
    assert guided[0] != plain[0]  # the guide did change the other row
    assert re.fullmatch(REGEX, _text(tok, guided[0]), re.ASCII)


def test_assisted_generation_equals_plain_greedy() -> None:
    main = load_model(TINY_RANDOM, dtype="float64")
    draft = load_model(TINY_RANDOM_DRAFT, dtype="float64")
    inputs = _encode(main.tokenizer, PROMPTS[:1])  # transformers: assisted needs batch 1
    plain_proc = GuidedLogitsProcessor(JSON, main.tokenizer, json_whitespace="compact")
    plain = _generate(main, inputs, plain_proc)
    assisted_proc = _Recording(JSON, main.tokenizer, json_whitespace="compact")
    assisted = _generate(main, inputs, assisted_proc, assistant_model=draft.model)
    assert assisted == plain
    jsonschema.validate(json.loads(_text(main.tokenizer, assisted[0])), SCHEMA)
    widths = assisted_proc.widths
    assert any(b < a for a, b in itertools.pairwise(widths))  # it did go back


class _Recording(GuidedLogitsProcessor):
    """Records the width of each call's ``input_ids``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.widths: list[int] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.widths.append(input_ids.shape[1])
        return super().__call__(input_ids, scores)


def test_reset_allows_reuse(lm: LoadedModel, tok: TokenizerInfo) -> None:
    inputs = _encode(tok, PROMPTS)
    proc = GuidedLogitsProcessor(JSON, tok, json_whitespace="compact")
    first = _generate(lm, inputs, proc)
    proc.reset()
    assert _generate(lm, inputs, proc) == first
    proc.reset()
    proc(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, tok.vocab_size))
    with pytest.raises(ValueError, match="batch size changed from 1 to 2"):
        proc(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, tok.vocab_size))


# Direct calls: no model.


def _mask(proc: GuidedLogitsProcessor, prompt: list[int], gen: list[int], width: int) -> Any:
    ids = torch.tensor([prompt + gen])
    return torch.isinf(proc(ids, torch.zeros(1, width))[0])


def test_sync_after_rollback_equals_fresh_processor(tok: TokenizerInfo) -> None:
    guide = GuidedDecodingParams(regex=r"(abc|abd)-[0-9]{2}-xyz")
    tokens = [*tok.encode("abd-42-xyz"), tok.eos_token_id]
    prompt, width = [7, 8, 9], tok.vocab_size
    expected = []
    for n in range(len(tokens)):
        fresh = GuidedLogitsProcessor(guide, tok, prompt_length=len(prompt))
        expected.append(_mask(fresh, prompt, tokens[:n], width))
    proc = GuidedLogitsProcessor(guide, tok)
    order = [0, 1, 2, len(tokens) - 1, 1, 3, 2, 0, len(tokens) - 2, len(tokens) - 1, 1]
    for n in order:
        assert torch.equal(_mask(proc, prompt, tokens[:n], width), expected[n]), n
    assert len({m.sum().item() for m in expected}) > 1


@pytest.mark.parametrize("disable", [None, True, False], ids=["default", "on", "off"])
def test_objects_are_closed_unless_asked_not_to_be(
    tok: TokenizerInfo, disable: bool | None
) -> None:
    """``disable_additional_properties`` (on by default, as in the engine): after the one
    property an object names, no ``,`` opens another."""
    guide = GuidedDecodingParams(json_schema={"type": "object", "properties": {"a": {}}})
    option = {} if disable is None else {"disable_additional_properties": disable}
    proc = GuidedLogitsProcessor(guide, tok, prompt_length=1, **option)  # type: ignore[arg-type]
    (comma,) = tok.encode(",")
    masked = _mask(proc, [5], tok.encode('{"a":1'), tok.vocab_size)
    assert bool(masked[comma]) is (disable is not False)


def test_finished_row_is_left_unmasked(tok: TokenizerInfo) -> None:
    tokens = [*tok.encode("yes"), tok.eos_token_id]
    proc = GuidedLogitsProcessor(GuidedDecodingParams(choice=["yes"]), tok)
    for n in range(len(tokens)):
        assert _mask(proc, [5], tokens[:n], tok.vocab_size).any()
    pads = [77, tok.eos_token_id, 78]  # never fed: what follows a stop token is padding
    for n in range(len(pads) + 1):  # the stop token is fed in the first of these calls
        assert not _mask(proc, [5], tokens + pads[:n], tok.vocab_size).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_wider_scores_mask_the_padding_columns(tok: TokenizerInfo, dtype: torch.dtype) -> None:
    proc = GuidedLogitsProcessor(GuidedDecodingParams(choice=["yes"]), tok)
    width = tok.vocab_size + 64
    scores = torch.zeros(1, width, dtype=dtype)
    out = proc(torch.tensor([[5]]), scores)
    assert out is scores and out.dtype == dtype
    allowed = torch.nonzero(~torch.isinf(out[0])).flatten().tolist()
    assert allowed and all(t < tok.real_vocab_size for t in allowed)
    assert tok.encode("yes")[0] in allowed


def test_hf_tokenizer_is_wrapped_with_the_scores_width(tok: TokenizerInfo) -> None:
    guide, width = GuidedDecodingParams(choice=["yes", "no"]), tok.vocab_size + 32
    from_hf = GuidedLogitsProcessor(guide, tok.hf_tokenizer)(
        torch.tensor([[5]]), torch.zeros(1, width)
    )
    from_info = GuidedLogitsProcessor(guide, tok)(torch.tensor([[5]]), torch.zeros(1, width))
    assert torch.equal(torch.isinf(from_hf), torch.isinf(from_info))
    assert torch.isinf(from_hf[0, tok.real_vocab_size :]).all()


def test_errors(tok: TokenizerInfo) -> None:
    guide = GuidedDecodingParams(choice=["yes"])
    narrow = tok.real_vocab_size - 1
    with pytest.raises(ValueError, match="fewer than the tokenizer's"):
        GuidedLogitsProcessor(guide, tok)(torch.tensor([[5]]), torch.zeros(1, narrow))
    with pytest.raises(ValueError, match="got 2 guides but generate runs a batch of 3"):
        proc = GuidedLogitsProcessor([guide, None], tok)
        proc(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, tok.vocab_size))
    bad = tok.encode("no")[0]
    proc = GuidedLogitsProcessor([None, guide], tok, prompt_length=1)
    with pytest.raises(ValueError, match=f"row 1: .*token {bad}"):
        proc(torch.tensor([[5, 6], [5, bad]]), torch.zeros(2, tok.vocab_size))
    with pytest.raises(ValueError, match="vocab_size=10"):
        GuidedLogitsProcessor(guide, tok, vocab_size=10)(torch.tensor([[5]]), torch.zeros(1, 11))
    with pytest.raises(ValueError, match=r"row 0: .*regex"):
        proc = GuidedLogitsProcessor(GuidedDecodingParams(regex="(unclosed"), tok)
        proc(torch.tensor([[5]]), torch.zeros(1, tok.vocab_size))
    proc = GuidedLogitsProcessor(guide, tok)
    proc(torch.tensor([[5, 6]]), torch.zeros(1, tok.vocab_size))
    with pytest.raises(ValueError, match="no longer start with the prompts"):
        proc(torch.tensor([[7, 6, 8]]), torch.zeros(1, tok.vocab_size))
    with pytest.raises(ValueError, match="sequence of them"):
        GuidedLogitsProcessor("yes", tok)  # type: ignore[arg-type]
