"""The ``guidedec`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEMO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}


def _load_schema(value: str | None) -> dict[str, Any]:
    if value is None:
        return DEMO_SCHEMA
    path = Path(value)
    text = path.read_text(encoding="utf-8") if path.exists() else value
    schema = json.loads(text)
    if not isinstance(schema, dict):
        raise SystemExit("--schema must be a JSON object (a file path or inline JSON)")
    return schema


def demo(args: argparse.Namespace) -> int:
    """Constrain a random-logits sampler to a JSON schema and print the (valid) outputs."""
    import jsonschema

    from guidedec import GuidedDecoder, GuidedDecodingConfig, GuidedDecodingParams, TokenizerInfo
    from guidedec.testing import random_guided_generate

    schema = _load_schema(args.schema)
    tokenizer = TokenizerInfo.default()
    config = GuidedDecodingConfig(
        backend=args.backend, tokenizer=tokenizer, json_whitespace=args.whitespace
    )
    decoder = GuidedDecoder(
        config=config, max_num_sequences=args.count, vocab_size=tokenizer.vocab_size
    )
    print(f"tokenizer: {tokenizer}")
    print(f"backend: {args.backend}; whitespace: {args.whitespace}; schema: {json.dumps(schema)}")
    print("the 'model' is random logits: the text is nonsense, its shape is the schema's\n")
    params = GuidedDecodingParams(json_schema=schema)
    start = time.perf_counter()
    outputs = random_guided_generate(
        decoder, [params] * args.count, seed=args.seed, max_tokens=args.max_tokens
    )
    elapsed = time.perf_counter() - start
    all_valid = True
    for i, out in enumerate(outputs):
        text = tokenizer.decode(out.token_ids)
        status = _validate(text, schema, out.finished, jsonschema) if not out.error else out.error
        all_valid &= status == "valid"
        print(f"[{i}] {len(out.token_ids)} tokens, {status}\n{text}\n")
    tokens = sum(len(o.token_ids) for o in outputs)
    print(f"{tokens} tokens in {elapsed:.2f} s")
    return 0 if all_valid else 1


def _validate(text: str, schema: dict[str, Any], finished: bool, jsonschema: Any) -> str:
    if not finished:
        return "unfinished (max tokens reached)"
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return f"INVALID: {exc}"
    return "valid"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guidedec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("demo", help=demo.__doc__)
    run.add_argument("--schema", help="JSON schema: a file path or inline JSON")
    run.add_argument("--backend", default="auto", choices=["auto", "xgrammar", "llguidance"])
    run.add_argument(
        "--whitespace",
        default="compact",
        choices=["compact", "flexible"],
        help="JSON whitespace (random logits pick whitespace often: compact reads best)",
    )
    run.add_argument("--count", type=int, default=3, help="outputs to generate (one batch)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--max-tokens", type=int, default=256)
    run.set_defaults(func=demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
