"""guidedec: guided decoding (structured generation) for large language models.

Every token that a request's guide (JSON schema, regex, EBNF or Lark grammar, choice list,
structural tag) cannot accept next is masked to -inf before sampling, so the output always
follows the guide.
"""

from guidedec import bitmask, errors
from guidedec.decoder import GuidedDecoder, GuidedRequest
from guidedec.engine import LLM, RequestOutput, SamplingParams
from guidedec.grammar import (
    GrammarMatcher,
    GrammarMatcherFactory,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    GuideType,
    create_grammar_matcher_factory,
)
from guidedec.tokenizer import TokenizerInfo
from guidedec.version import __version__

__all__ = [
    "LLM",
    "GrammarMatcher",
    "GrammarMatcherFactory",
    "GuideType",
    "GuidedDecoder",
    "GuidedDecodingConfig",
    "GuidedDecodingParams",
    "GuidedRequest",
    "RequestOutput",
    "SamplingParams",
    "TokenizerInfo",
    "__version__",
    "bitmask",
    "create_grammar_matcher_factory",
    "errors",
]
