"""The choices of one HTTP request (``n`` per prompt, and each prompt of a list on
``/v1/completions``) run as separate engine requests, in the same batches; together they
finish, fail or are aborted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request

from guidedec.engine import RequestOutput, SamplingParams
from guidedec.engine.prompts import Prompt
from guidedec.server.async_engine import AsyncEngine, Delta

DISCONNECT_POLL_S = 0.25
"""How often a non-streaming request checks that its client is still there."""


class ClientGoneError(Exception):
    """The client of a non-streaming request went away before its output was ready."""


class ShuttingDownError(Exception):
    """A request still running when the server's graceful shutdown ran out (HTTP 503)."""


@dataclass(frozen=True)
class Choice:
    """One output a request asked for: ``choices[index]`` of the response."""

    index: int
    prompt: Prompt
    params: SamplingParams
    prompt_index: int = 0


def expand(prompts: Sequence[Prompt], params: Sequence[SamplingParams], n: int) -> list[Choice]:
    """``n`` choices per prompt, prompt-major (vLLM's order); choice ``j`` of a seeded request
    samples with ``seed + j``, so the choices differ and the request stays reproducible."""
    choices = []
    for p, (prompt, base) in enumerate(zip(prompts, params, strict=True)):
        for j in range(n):
            seed = None if base.seed is None else base.seed + j
            choices.append(Choice(p * n + j, prompt, replace(base, seed=seed), p))
    return choices


async def _output(engine: AsyncEngine, choice: Choice) -> RequestOutput:
    async for delta in engine.generate(choice.prompt, choice.params):
        if delta.output is not None:
            return delta.output
    raise RuntimeError("the engine ended a request without an output")


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the choices' tasks: that closes their engine streams, which aborts them."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def collect(
    engine: AsyncEngine, choices: Sequence[Choice], request: Request
) -> list[RequestOutput]:
    """Every choice's output, in order; a client that goes away before they are ready aborts
    them all (their slots are freed, as for a streaming client that leaves)."""
    tasks = [asyncio.ensure_future(_output(engine, c)) for c in choices]
    try:
        while True:
            done, pending = await asyncio.wait(
                tasks, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_EXCEPTION
            )
            failed = [t for t in done if t.exception() is not None]
            if failed:
                await _cancel(list(pending))
                raise failed[0].exception()  # type: ignore[misc]
            if not pending:
                return [t.result() for t in tasks]
            if await request.is_disconnected():
                await _cancel(tasks)
                raise ClientGoneError
    except asyncio.CancelledError:  # the server's graceful shutdown ran out
        await _cancel(tasks)
        raise ShuttingDownError from None


async def merged(
    engine: AsyncEngine, choices: Sequence[Choice]
) -> AsyncIterator[tuple[Choice, Delta]]:
    """Every choice's deltas as they come, tagged with their choice. Leaving early (a client
    that disconnects) aborts every choice still running."""
    queue: asyncio.Queue[tuple[Choice, Delta] | BaseException | None] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for delta in engine.generate(choice.prompt, choice.params):
                queue.put_nowait((choice, delta))
        except Exception as exc:  # the request could not be queued: the stream says why
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        await _cancel(tasks)
