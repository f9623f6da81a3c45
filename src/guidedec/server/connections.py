"""Slow clients: a connection that takes too long to send its request is closed.

uvicorn bounds nothing a client sends slowly: a connection that sends nothing is kept open, and
a request head trickled a byte at a time ("slowloris") resets the keep-alive timer with every
byte, so a few hundred such connections hold the server's file descriptors and memory for good.
:class:`GuardedH11Protocol` (uvicorn's h11 protocol, checked once a second) closes a connection

- whose request head (the request line and headers) is not complete within ``header_timeout``
  seconds of the connection's start or of the previous response's end;
- whose body has been waiting ``body_timeout`` seconds for its next byte.

A request whose head and body have arrived is never closed by these (a long generation, or a
stream, takes as long as it takes); the client's disconnect aborts it as before. The server
also caps open connections (``limit_concurrency``: 503 past it). This is what nginx's
``client_header_timeout`` and ``client_body_timeout`` do, with shorter defaults.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1024
CHECK_EVERY_S = 1.0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines on reading a request (see the module docstring).
    Use :func:`guarded_protocol` for a class with other deadlines."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_since = time.monotonic()  # start of the wait for a request head
        self._last_read = self._waiting_since
        self._guard: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self._last_read = time.monotonic()
        self._guard = self.loop.call_later(CHECK_EVERY_S, self._check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._waiting_since = time.monotonic()  # the next request's head is waited for anew
        super().on_response_complete()

    def _check(self) -> None:
        self._guard = None
        if self.transport.is_closing():
            return
        now, state = time.monotonic(), self.conn.their_state
        late = (state is h11.IDLE and now - self._waiting_since > self.header_timeout) or (
            state is h11.SEND_BODY and now - self._last_read > self.body_timeout
        )
        if late:
            self.transport.close()  # connection_lost marks a request in flight disconnected
            return
        self._guard = self.loop.call_later(CHECK_EVERY_S, self._check)


def guarded_protocol(header_timeout: float, body_timeout: float) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` with these deadlines (seconds), for uvicorn's ``http``."""
    if header_timeout <= 0 or body_timeout <= 0:
        raise ValueError("the header and body timeouts must be positive")
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout},
    )
