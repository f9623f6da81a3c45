"""Slow clients: uvicorn with :class:`GuardedH11Protocol` closes a connection whose request head
or body does not arrive in time, and leaves alone requests that have arrived (however long they
take to answer) and the healthy clients beside the slow ones. A real server on a socket."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from guidedec.cli import build_parser
from guidedec.server.connections import guarded_protocol

TIMEOUT = 1.0
CLOCK_SLACK = 0.005  # the event loop's timers and time.monotonic() may differ by a tick


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/fast")
    async def fast() -> dict[str, str]:
        return {"ok": "fast"}

    @app.post("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(3 * TIMEOUT)  # longer than either deadline, once the request is in
        return {"ok": "slow"}

    return app


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = int(probe.getsockname()[1])
    config = uvicorn.Config(
        _app(),
        host="127.0.0.1",
        port=free,
        log_level="warning",
        http=guarded_protocol(TIMEOUT, TIMEOUT),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield free
    server.should_exit = True
    thread.join(timeout=10)


def _closed_within(
    conn: socket.socket, seconds: float, trickle: bytes = b"", start: float | None = None
) -> float | None:
    """Seconds from ``start`` (default: now) until the server closed ``conn`` (None if it did
    not within ``seconds``), while sending ``trickle`` one byte every 0.2 s."""
    start = time.monotonic() if start is None else start
    conn.settimeout(0.2)
    sent = 0
    while time.monotonic() - start < seconds:
        if sent < len(trickle):
            try:
                conn.send(trickle[sent : sent + 1])
            except OSError:
                return time.monotonic() - start
            sent += 1
        try:
            if conn.recv(4096) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


def _in_time(took: float | None) -> bool:
    """Closed no sooner than the deadline and not long after it. ``took`` counts from a moment
    before the connection was opened, so the server's own clock cannot have started earlier."""
    return took is not None and TIMEOUT - CLOCK_SLACK <= took <= TIMEOUT + 2.5


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        took = _closed_within(conn, 5 * TIMEOUT, start=start)
    assert _in_time(took)


def test_a_trickled_request_head_is_closed_and_others_are_served(port: int) -> None:
    head = b"POST /slow HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        # Meanwhile, a healthy client is answered at once.
        assert httpx.get(f"http://127.0.0.1:{port}/fast", timeout=5).json() == {"ok": "fast"}
        took = _closed_within(conn, 5 * TIMEOUT, trickle=head, start=start)
    assert _in_time(took)


def test_a_body_that_stops_arriving_is_closed(port: int) -> None:
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        took = _closed_within(conn, 5 * TIMEOUT, start=start)
    assert _in_time(took)


def test_a_request_that_has_arrived_takes_as_long_as_it_takes(port: int) -> None:
    response = httpx.post(f"http://127.0.0.1:{port}/slow", json={}, timeout=10)
    assert response.json() == {"ok": "slow"}


def test_serve_takes_the_deadlines_and_the_connection_cap() -> None:
    args = build_parser().parse_args(
        ["serve", "--header-timeout", "2.5", "--body-timeout", "4", "--max-connections", "7"]
    )
    assert (args.header_timeout, args.body_timeout, args.max_connections) == (2.5, 4.0, 7)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--header-timeout", "0"])
    with pytest.raises(ValueError, match="positive"):
        guarded_protocol(0, 1)
