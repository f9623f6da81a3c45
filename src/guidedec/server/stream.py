"""Incremental detokenisation for streaming: text deltas that never split a character."""

from __future__ import annotations

from collections.abc import Sequence

from guidedec.tokenizer import TokenizerInfo

_INCOMPLETE = "\ufffd"  # what a byte-level tokenizer decodes a cut UTF-8 sequence to


class TextStream:
    """Accumulates a request's tokens and returns the text each push adds.

    Text ending in a cut multi-byte character is held back until the next push completes it (or
    the stream ends), so the concatenated deltas equal the decoded output.
    """

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.sent = ""

    def push(self, token_ids: Sequence[int], *, final: bool = False) -> str:
        self.token_ids.extend(token_ids)
        text = self.tokenizer.decode(self.token_ids)
        if text.endswith(_INCOMPLETE) and not final:
            return ""
        delta = text[len(self.sent) :] if text.startswith(self.sent) else text
        self.sent = text
        return delta
