"""What the vLLM plugin reads of a request and of vLLM's configuration: the guide in a
``SamplingParams``'s ``extra_args["guidedec"]`` and the engine options in
``additional_config["guidedec"]``. Importable without vLLM."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import Any

from guidedec.errors import GuidedecError
from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.tokenizer import TokenizerInfo

EXTRA_KEY = "guidedec"
"""The key of ``SamplingParams.extra_args`` that holds a request's guide."""


def guide_of(params: Any) -> GuidedDecodingParams | None:
    """The guide in a vLLM ``SamplingParams``'s ``extra_args["guidedec"]``, None if it has none.

    Raises:
        ValueError: the entry is not an object of ``GuidedDecodingParams`` fields (and
            ``close_within_budget``).
    """
    return request_options(params)[0]


def request_options(params: Any) -> tuple[GuidedDecodingParams | None, bool]:
    """The guide in ``extra_args["guidedec"]`` (None if it has none) and whether the request
    asks for budget-aware closing (``close_within_budget``, default False inside vLLM).

    Raises:
        ValueError: as :func:`guide_of` does.
    """
    extra = (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)
    if extra is None:
        return None, False
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as exc:
            raise ValueError(f"extra_args[{EXTRA_KEY!r}] is not valid JSON: {exc}") from None
    if not isinstance(extra, Mapping):
        raise ValueError(f"extra_args[{EXTRA_KEY!r}] must be an object, got {type(extra).__name__}")
    fields = dict(extra)
    closing = fields.pop("close_within_budget", False)
    if not isinstance(closing, bool):
        raise ValueError(
            f"extra_args[{EXTRA_KEY!r}].close_within_budget must be true or false, got {closing!r}"
        )
    try:
        return GuidedDecodingParams(**fields), closing
    except (TypeError, ValueError) as exc:
        raise ValueError(f"extra_args[{EXTRA_KEY!r}]: {exc}") from None


def check_syntax(guide: GuidedDecodingParams) -> None:
    """Compile ``guide`` as vLLM validates its request, where the model's tokenizer is not
    known: for a byte-level tokenizer (:meth:`TokenizerInfo.byte_level`, milliseconds), and
    where that fails, for the bundled 129k-token one (a guide may name tokens that only a real
    vocabulary has), so that a guide is refused only where the bundled tokenizer refuses it.

    Raises:
        GuidedecError: no backend compiles it (the message names the problem).
        ValueError: the guide is malformed.
    """
    try:
        syntax_factory(bytes_only=True).compile(guide)
    except (GuidedecError, ValueError):
        syntax_factory(bytes_only=False).compile(guide)


@cache
def syntax_factory(*, bytes_only: bool = False) -> GrammarMatcherFactory:
    """The factory that checks a guide's syntax when vLLM validates a request (see
    :func:`check_syntax`): on the byte-level tokenizer, or on the bundled one."""
    tokenizer = TokenizerInfo.byte_level() if bytes_only else TokenizerInfo.default()
    return create_grammar_matcher_factory(
        GuidedDecodingConfig(tokenizer=tokenizer, json_whitespace="compact")
    )


ENGINE_OPTIONS = (
    "backend",
    "auto_prefers",
    "json_whitespace",
    "fill_mode",
    "fill_threads",
    "out_of_place",
    "disable_additional_properties",
    "mask_time_limit_ms",
)
"""The keys of ``additional_config["guidedec"]`` (:class:`~guidedec.GuidedDecodingConfig`'s)."""
