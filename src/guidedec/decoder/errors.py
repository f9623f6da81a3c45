"""Why one request of a build cannot go on: collected by the build and returned as
``(request_id, message)``, never raised to the caller."""

from __future__ import annotations

from typing import TYPE_CHECKING

from guidedec.errors import GuidedecError

if TYPE_CHECKING:
    from guidedec.decoder.request import GuidedRequest

Failure = tuple[int, str]
DEAD_END = "reached a grammar state that allows no token (dead end)"


class RequestError(GuidedecError):
    """Why one request cannot go on; collected by ``build``, never raised to the caller."""


class SlowMasksError(RequestError):
    """A guide's masks take longer than ``mask_time_limit_ms``: its request fails, and the
    factory forgets the guide (:meth:`GrammarMatcherFactory.forget`), since it would fail every
    request and its grammar state may have grown large."""


def failure_message(req: GuidedRequest, exc: Exception) -> str:
    """The message of ``req``'s failure: its id, its slot and what went wrong."""
    if isinstance(exc, RequestError):
        return f"request {req.request_id} (slot {req.seq_slot}) {exc}"
    return f"request {req.request_id} (slot {req.seq_slot}) failed in guided decoding: {exc}"
