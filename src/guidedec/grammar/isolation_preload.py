"""Imported once by the compile isolation's fork server, before it forks any worker: both
backends and the default tokenizer's views of them are built here, so that every worker (and
every replacement of a killed one) starts with them."""

from guidedec.grammar.llguidance_backend import llguidance_tokenizer
from guidedec.grammar.xgrammar_backend import xgrammar_tokenizer_info
from guidedec.tokenizer import TokenizerInfo

_TOKENIZER = TokenizerInfo.default()
xgrammar_tokenizer_info(_TOKENIZER)
llguidance_tokenizer(_TOKENIZER)
