"""Request size: a body past ``max_request_bytes`` is refused (HTTP 413) before it is read whole.

A 50 MB prompt used to be read, parsed and tokenized in the event loop, holding ``/health`` for
38 s and leaving the memory behind. The middleware counts the body as it arrives (the
``Content-Length`` header first, then every chunk, for chunked uploads too) and answers 413 at
the first chunk past the limit; a body within it is handed on whole. A prompt within the body
limit is still checked against the model's context before it is tokenized
(:func:`too_long_to_fit`), and tokenized off the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from guidedec.server.protocol import error_body

DEFAULT_MAX_REQUEST_BYTES = 16 << 20
"""16 MiB: a full 128k-token context of text is well under 1 MiB."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: HTTP bodies of at most ``max_bytes`` bytes, else 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, int(declared))
            return
        # Read the body here, up to the limit, and hand it on whole.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_bytes:
                await self._refuse(send, seen)
                return
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, size: int) -> None:
        body = json.dumps(
            error_body(
                f"the request body is {size} bytes or more, past the server's limit of "
                f"{self.max_bytes} (--max-request-bytes)",
                kind="request_too_large",
            )
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def too_long_to_fit(text: str, max_model_len: int, longest_token_chars: int) -> bool:
    """Whether ``text`` cannot fit ``max_model_len`` tokens whatever its tokenization: each
    token covers at most ``longest_token_chars`` characters."""
    return len(text) > max_model_len * max(1, longest_token_chars)
