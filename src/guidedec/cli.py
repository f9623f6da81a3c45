"""The guidedec command line: generate (a model's outputs under a guide), serve (the
OpenAI-compatible API) and demo (random logits under a JSON schema, no model)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from guidedec.cli_bench import BenchError, add_bench
from guidedec.cli_generate import (
    CliError,
    build_llm,
    chat_template,
    generate,
    load_schema,
    schema_status,
)
from guidedec.cli_options import (
    add_chat_template,
    add_http,
    int_at_least,
    non_negative_float,
    speculative,
    top_p,
)
from guidedec.engine.reasoning import REASONING_PARSERS

TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "pythonic")
"""``serve --tool-call-parser``'s choices: :data:`guidedec.server.tool_calls.TOOL_PARSERS`
(named here so that the CLI starts without importing the server)."""

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

BACKENDS = ["auto", "xgrammar", "llguidance"]
GENERATE_EPILOG = """\
guides (at most one; none means unguided): FILE arguments are paths; --json-schema also takes
inline JSON starting with '{'. --choice takes one value and repeats, e.g.
  guidedec generate --temperature 1 --choice yes --choice no "Is it?"
exit status: 0 when every output ran, 1 on errors such as an unreadable file, 2 on bad
arguments, 3 when an output ended in grammar_error (reported with the others)."""


def demo(args: argparse.Namespace) -> int:
    """Constrain a random-logits sampler to a JSON schema and print the (valid) outputs."""
    from guidedec import (
        GuidedDecoder,
        GuidedDecodingConfig,
        GuidedDecodingParams,
        TokenizerInfo,
        create_grammar_matcher_factory,
    )
    from guidedec.testing import random_guided_generate

    schema = DEMO_SCHEMA if args.schema is None else load_schema(args.schema)
    tokenizer = TokenizerInfo.default()
    config = GuidedDecodingConfig(
        backend=args.backend, tokenizer=tokenizer, json_whitespace=args.whitespace
    )
    factory = create_grammar_matcher_factory(config)
    decoder = GuidedDecoder(config=config, factory=factory, max_num_sequences=args.count)
    print(f"tokenizer: {tokenizer}")
    print(f"backend: {args.backend}; whitespace: {args.whitespace}; schema: {json.dumps(schema)}")
    print("the 'model' is random logits: the text is nonsense, its shape is the schema's\n")
    params = GuidedDecodingParams(json_schema=schema)
    start = time.perf_counter()
    outputs = random_guided_generate(
        decoder, [params] * args.count, seed=args.seed, max_tokens=args.max_tokens
    )
    elapsed = time.perf_counter() - start
    all_valid = _print_demo_outputs(outputs, tokenizer, schema)
    print(f"{sum(len(o.token_ids) for o in outputs)} tokens in {elapsed:.2f} s")
    return 0 if all_valid else 1


def _print_demo_outputs(outputs: list[Any], tokenizer: Any, schema: dict[str, Any]) -> bool:
    """Print each output and its status; True when all are valid."""
    all_valid = True
    for i, out in enumerate(outputs):
        text = tokenizer.decode(out.token_ids)
        status = out.error or schema_status(text, schema, out.finished)
        all_valid &= status == "valid"
        print(f"[{i}] {len(out.token_ids)} tokens, {status}\n{text}\n")
    return all_valid


# --- the parser --------------------------------------------------------------------------------


def _add_demo(commands: Any) -> None:
    run = commands.add_parser("demo", help=demo.__doc__)
    run.add_argument("--schema", help="JSON schema: a file path or inline JSON")
    run.add_argument("--backend", default="auto", choices=BACKENDS)
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


def _add_guides(run: argparse.ArgumentParser) -> None:
    guides = run.add_mutually_exclusive_group()
    guides.add_argument("--json", action="store_true", help="any JSON object")
    guides.add_argument("--json-schema", metavar="FILE", help="a JSON schema file, or inline JSON")
    guides.add_argument("--regex", metavar="R", help="a regular expression the output matches")
    guides.add_argument("--ebnf", metavar="FILE", help="an EBNF/GBNF grammar file (root rule)")
    guides.add_argument("--lark", metavar="FILE", help="a Lark grammar file (start rule)")
    guides.add_argument(
        "--choice",
        action="append",
        metavar="TEXT",
        help="the output is one of these: one per --choice (--choice yes --choice no)",
    )
    guides.add_argument("--structural-tag", metavar="FILE", help="a structural tag JSON file")
    run.add_argument(
        "--think-first",
        action="store_true",
        help="with --json-schema (an object or an array) or --json: free text may come before "
        "the value; it is printed as the reasoning",
    )


def _add_engine(run: argparse.ArgumentParser) -> None:
    run.add_argument("--model", default="tiny-random", help="model name or folder")
    run.add_argument("--backend", default="auto", choices=BACKENDS, help="grammar backend")
    run.add_argument(
        "--speculative", type=speculative, metavar="ngram|draft:M", help="speculative decoding"
    )
    run.add_argument(
        "--num-draft-tokens", type=int_at_least(1), default=4, metavar="K", help="per step"
    )
    run.add_argument(
        "--jump-forward",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="propose the tokens a guide forces as draft tokens, verified in one forward "
        "(outputs unchanged; default: on, except with a draft model or --cuda-graphs)",
    )
    run.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        help="a reasoning model: its thinking is free and the guide applies after </think>",
    )
    run.add_argument(
        "--max-num-seqs", type=int_at_least(1), default=8, metavar="N", help="batch size"
    )
    _add_guide_settings(run)


def _add_guide_settings(run: argparse.ArgumentParser) -> None:
    """The engine's settings of guides: whitespace, closed objects, compiles and mask limits."""
    run.add_argument(
        "--whitespace", default="flexible", choices=["flexible", "compact"], help="JSON whitespace"
    )
    run.add_argument(
        "--disable-additional-properties",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="close each JSON-schema object that names its properties to others (outputs stay "
        "valid; a small model writes fewer wrong arguments); --no-...: the schema's language "
        "as written",
    )
    run.add_argument(
        "--no-approximate",
        dest="approximate",
        action="store_false",
        help="auto: fail a JSON schema no backend enforces exactly instead of approximating it",
    )
    run.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="build the masks after the forward, not while it runs",
    )
    run.add_argument(
        "--max-model-len",
        type=int_at_least(2),
        metavar="N",
        help="longest prompt + output (default: the model's; bounds the --cuda-graphs caches)",
    )
    run.add_argument(
        "--fill-mode",
        default="auto",
        choices=["auto", "parallel", "sequential"],
        help="fill a batch's mask rows in parallel, one by one, or whichever measures faster",
    )
    run.add_argument(
        "--compile-cache-dir",
        metavar="DIR",
        help="keep xgrammar's compiled grammars in DIR across restarts (shared by processes)",
    )
    run.add_argument(
        "--mask-time-limit-ms",
        type=non_negative_float,
        default=20.0,
        metavar="MS",
        help="fail a guided request whose token masks take longer than MS three times in a row "
        "(default: 20; 0: no limit)",
    )
    run.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="static KV caches; decode steps replayed from CUDA graphs (no graph on a CPU)",
    )


def _add_sampling(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--max-tokens", type=int_at_least(1), default=256, metavar="N", help="per prompt"
    )
    run.add_argument(
        "--temperature", type=non_negative_float, default=0.0, metavar="T", help="0: greedy"
    )
    run.add_argument("--top-p", type=top_p, default=1.0, metavar="P", help="1: off")
    run.add_argument("--top-k", type=int_at_least(0), default=0, metavar="K", help="0: off")
    run.add_argument("--seed", type=int, metavar="S", help="prompt i samples with seed S + i")
    run.add_argument(
        "--thinking-token-budget",
        type=int_at_least(0),
        metavar="N",
        help="with --reasoning-parser: end the thinking after N tokens",
    )
    run.add_argument(
        "--stop", action="append", metavar="TEXT", help="a stop string (repeat for more)"
    )
    run.add_argument(
        "--no-close-within-budget",
        dest="close_within_budget",
        action="store_false",
        help="cut guided outputs at --max-tokens instead of closing them within it",
    )


def _add_generate(commands: Any) -> None:
    run = commands.add_parser(
        "generate",
        help=generate.__doc__,
        description=generate.__doc__,
        epilog=GENERATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_guides(run)
    _add_engine(run)
    _add_sampling(run)
    run.add_argument(
        "--chat",
        action="store_true",
        help="each PROMPT is a user message, sent through the model's chat template",
    )
    run.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    add_chat_template(run)
    run.add_argument("--jsonl", action="store_true", help="one JSON object per prompt on stdout")
    run.add_argument("prompts", nargs="+", metavar="PROMPT", help="one output per prompt")
    run.set_defaults(func=generate)


def serve(args: argparse.Namespace) -> int:
    """Serve the OpenAI-compatible API (completions, chat completions, structured outputs)."""
    import uvicorn

    from guidedec.server import create_app
    from guidedec.server.connections import (
        DEFAULT_BODY_TIMEOUT_S,
        DEFAULT_HEADER_TIMEOUT_S,
        DEFAULT_MAX_CONNECTIONS,
        guarded_protocol,
    )
    from guidedec.server.limits import DEFAULT_MAX_REQUEST_BYTES

    template = chat_template(args)  # before the model loads: a bad one fails at once
    app = create_app(
        build_llm(args),
        model_name=args.served_model_name,
        max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
        **(
            {}
            if args.default_max_tokens is None
            else {"default_max_tokens": args.default_max_tokens or None}
        ),
        api_key=args.api_key or os.environ.get("GUIDEDEC_API_KEY") or None,
        allowed_origins=args.allowed_origins,
        allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers,
        allow_credentials=args.allow_credentials,
        chat_template=template,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
        http=guarded_protocol(
            args.header_timeout or DEFAULT_HEADER_TIMEOUT_S,
            args.body_timeout or DEFAULT_BODY_TIMEOUT_S,
        ),
        limit_concurrency=args.max_connections or DEFAULT_MAX_CONNECTIONS,
    )
    return 0


def _add_serve(commands: Any) -> None:
    run = commands.add_parser("serve", help=serve.__doc__, description=serve.__doc__)
    _add_engine(run)
    add_chat_template(run)
    run.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='serve tool_choice "auto": the model writes freely, and each tool call it '
        "starts is guided by the tool's schema and parsed into tool_calls",
    )
    run.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        help="the format the model writes tool calls in (default: the one its chat "
        "template teaches; hermes for a template that shows no tools)",
    )
    add_http(run)
    run.set_defaults(func=serve)


def export_model(args: argparse.Namespace) -> int:
    """Write a model (tiny-random by default) and its tokenizer as a Hugging Face folder, for
    transformers or vLLM to load offline."""
    from guidedec.engine.model import export_model as export

    try:
        folder = export(args.model, args.folder, seed=args.seed)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot export {args.model!r}: {exc}") from exc
    print(f"wrote {args.model} (seed {args.seed}) to {folder}")
    return 0


def _add_export_model(commands: Any) -> None:
    run = commands.add_parser("export-model", help=export_model.__doc__)
    run.add_argument("model", help="tiny-random, tiny-random-draft, or a model folder")
    run.add_argument("folder", help="where to write it")
    run.add_argument("--seed", type=int, default=0, help="the tiny models' weight seed")
    run.set_defaults(func=export_model)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guidedec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_generate(commands)
    _add_serve(commands)
    add_bench(commands)
    _add_demo(commands)
    _add_export_model(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (argparse exits with 2 on bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    empty = [i for i, prompt in enumerate(getattr(args, "prompts", [])) if not prompt]
    if empty:
        parser.error(f"generate: prompt {empty[0]} is empty")
    try:
        return int(args.func(args))
    except (CliError, BenchError) as exc:
        print(f"guidedec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("guidedec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
