"""Incremental detokenisation for streaming: text deltas that never split a character and
never send what a stop string may yet cut."""

from __future__ import annotations

from collections.abc import Sequence

from guidedec.tokenizer import TokenizerInfo

_INCOMPLETE = "\ufffd"  # what a byte-level tokenizer decodes a cut UTF-8 sequence to


class TextStream:
    """Accumulates a request's tokens and returns the text each push adds.

    Text ending in a cut multi-byte character is held back until the next push completes it (or
    the stream ends), and so are the last ``len(longest stop string) - 1`` characters while a
    stop string may still begin there; the last push takes the output's own text (cut at its
    stop string), so the concatenated deltas equal ``RequestOutput.text``.
    """

    def __init__(self, tokenizer: TokenizerInfo, stop: Sequence[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.sent = ""
        self.hold = max((len(s) for s in stop or ()), default=1) - 1

    def push(self, token_ids: Sequence[int], *, final_text: str | None = None) -> str:
        """The new text after ``token_ids``; ``final_text``: the output's text, at its end."""
        self.token_ids.extend(token_ids)
        if final_text is not None:
            text = final_text
        else:
            text = self.tokenizer.decode(self.token_ids)
            if text.endswith(_INCOMPLETE):
                return ""
            if self.hold:
                text = text[: len(text) - self.hold]
        if not text.startswith(self.sent):  # a re-decoded tail changed: resend from the start
            return ""
        delta = text[len(self.sent) :]
        self.sent = text
        return delta
