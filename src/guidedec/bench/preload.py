"""Imported once by the compliance benchmark's fork server, before it forks any worker: the
default tokenizer and both backends' views of it are built here, so that every worker (and every
replacement of a killed one) starts with them."""

from guidedec.grammar.llguidance_backend import llguidance_tokenizer
from guidedec.grammar.xgrammar_backend import xgrammar_tokenizer_info
from guidedec.tokenizer import TokenizerInfo

_TOKENIZER = TokenizerInfo.default()
xgrammar_tokenizer_info(_TOKENIZER)
llguidance_tokenizer(_TOKENIZER)
