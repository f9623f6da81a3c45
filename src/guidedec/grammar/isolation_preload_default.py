"""The fork server's preload for engines on the default tokenizer: both backends and that
tokenizer's views of them (1.7 s of building that no worker repeats)."""

import guidedec.grammar.xgrammar_backend  # noqa: F401  # loaded once, for every worker
from guidedec.grammar.llguidance_backend import llguidance_tokenizer
from guidedec.grammar.xgrammar_tokenizer import xgrammar_tokenizer_info
from guidedec.tokenizer import TokenizerInfo

_TOKENIZER = TokenizerInfo.default()
xgrammar_tokenizer_info(_TOKENIZER)
llguidance_tokenizer(_TOKENIZER)
