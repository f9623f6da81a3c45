"""Grammar layer: guides, the matcher contract, the backends, dialect conversion, compile cache."""

from guidedec.grammar.config import GuidedDecodingConfig
from guidedec.grammar.factory import create_grammar_matcher_factory
from guidedec.grammar.matcher import GrammarMatcher, GrammarMatcherFactory
from guidedec.grammar.params import GuidedDecodingParams, GuideType

__all__ = [
    "GrammarMatcher",
    "GrammarMatcherFactory",
    "GuideType",
    "GuidedDecodingConfig",
    "GuidedDecodingParams",
    "create_grammar_matcher_factory",
]
