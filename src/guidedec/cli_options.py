"""The command line's argument types and the option groups several commands share.

An argument type raises ``ValueError`` or ``argparse.ArgumentTypeError`` on a bad value, which
makes argparse exit with status 2.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
    return value


def top_p(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def speculative(text: str) -> str:
    if text == "ngram" or (text.startswith("draft:") and len(text) > len("draft:")):
        return text
    raise argparse.ArgumentTypeError(f"must be 'ngram' or 'draft:<model>', got {text!r}")


def add_chat_template(parser: Any) -> None:
    parser.add_argument(
        "--chat-template",
        metavar="FILE_OR_TEMPLATE",
        help="the Jinja chat template to render chats with, a file or the template itself "
        "(default: the model's own)",
    )


def add_http(run: argparse.ArgumentParser) -> None:
    """The server's HTTP settings: address, limits, timeouts, authentication and CORS."""
    run.add_argument("--host", default="127.0.0.1", help="address to listen on")
    run.add_argument("--port", type=int_at_least(1), default=8000, help="port to listen on")
    run.add_argument("--served-model-name", help="model id in the API (default: --model)")
    run.add_argument(
        "--max-request-bytes",
        type=int_at_least(1),
        help="larger request bodies get HTTP 413 (default: 16 MiB)",
    )
    run.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="on SIGTERM, seconds to let requests in flight finish before closing their "
        "connections, which aborts them (default: 10)",
    )
    run.add_argument(
        "--header-timeout",
        type=positive_float,
        metavar="S",
        help="close a connection whose request head has not arrived within S seconds of its "
        "start or of the previous response (default: 10)",
    )
    run.add_argument(
        "--body-timeout",
        type=positive_float,
        metavar="S",
        help="close a connection whose request body has sent nothing for S seconds (default: 30)",
    )
    run.add_argument(
        "--max-connections",
        type=int_at_least(1),
        metavar="N",
        help="connections and requests at once; past it, HTTP 503 (default: 1024)",
    )
    run.add_argument(
        "--default-max-tokens",
        type=int_at_least(0),
        metavar="N",
        help="max_tokens of a chat completion that gives none; 0: the room left in the context, "
        "as vLLM (default: 256)",
    )
    run.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on /v1 requests (or set GUIDEDEC_API_KEY)",
    )
    for name, what in (("origins", "origins"), ("methods", "methods"), ("headers", "headers")):
        run.add_argument(
            f"--allowed-{name}",
            type=json_list,
            default=["*"],
            metavar="JSON",
            help=f'CORS: allowed {what}, a JSON list (default: ["*"])',
        )
    run.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {text!r}")
    return value
