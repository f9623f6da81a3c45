"""The backend contract: a four-operation grammar matcher and the factory that makes them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from guidedec.errors import REQUEST_ERRORS
from guidedec.grammar.config import CompileProbe, GuidedDecodingConfig
from guidedec.grammar.params import GuidedDecodingParams

REJECTED, TERMINATED, FILLED = 0, 1, 2
"""What :meth:`GrammarMatcher.advance_and_fill` did: the token was rejected; it was accepted
and terminated the matcher; it was accepted and the row filled."""


class GrammarMatcher(ABC):
    """The incremental state of one request's grammar.

    A matcher only moves forward token by token, and undoes its last tokens with ``rollback``
    (speculative decoding). Once a stop token is accepted the matcher is terminated.
    """

    backend = ""
    """The name of the backend whose grammar the matcher runs (``xgrammar``, ``llguidance``)."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False (state unchanged) if the grammar rejects it, and
        always once terminated."""

    def advance(self, token_id: int) -> bool:
        """:meth:`accept_token` for a token the caller does not go on without (a sampled token
        whose rejection fails the request): the same answer, but after a rejection the matcher
        may be unusable, so the caller must drop it. A backend whose checked accept costs more
        than its plain one overrides this with the plain one."""
        return self.accept_token(token_id)

    unchecked_advance = False
    """Whether :meth:`advance` skips checks that :meth:`accept_token` makes; the decoder then
    advances by a draft token with it once the row just filled shows the token is allowed."""

    def advance_and_fill(self, token_id: int, bitmask: torch.Tensor, index: int) -> int:
        """Advance by ``token_id`` and, unless that terminated the matcher, fill row ``index``
        of ``bitmask``: the decoder's three calls per row in one.

        The token goes through :meth:`advance` where :attr:`unchecked_advance` (the caller has
        read it in the row before), else through :meth:`accept_token`. Returns
        :data:`REJECTED` (nothing filled; after ``advance`` the matcher may be unusable),
        :data:`TERMINATED` (accepted, nothing filled) or :data:`FILLED`. A backend overrides
        this with its native calls, without the Python calls in between.
        """
        if not (self.advance(token_id) if self.unchecked_advance else self.accept_token(token_id)):
            return REJECTED
        if self.is_terminated():
            return TERMINATED
        self.fill_next_token_bitmask(bitmask, index)
        return FILLED

    def error(self) -> str | None:
        """What the backend says went wrong after a rejected :meth:`advance` (a parse or lexer
        error), for the request's failure message; None where it says nothing."""
        return None

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (a stop token counts as one)."""

    @abstractmethod
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed next tokens into row ``index`` of the int32 ``bitmask``.

        Bit ``t % 32`` of word ``t // 32`` is set iff token ``t`` is allowed (stop tokens are
        allowed where the grammar may end). Must not be called once terminated.
        """

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether a stop token has been accepted (the output is complete)."""

    def completes(self, tokens: Sequence[int]) -> bool:
        """Whether the matcher accepts ``tokens`` one after another and is terminated after
        the last (a completion of the guide ends with a stop token); the state is left as it
        was. A backend that can check a run of tokens in one native call overrides this."""
        accepted = 0
        for token in tokens:
            if not self.accept_token(token):
                break
            accepted += 1
        complete = accepted == len(tokens) and self.is_terminated()
        if accepted:
            self.rollback(accepted)
        return complete

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next from the current state (jump-forward), each accepted
        in turn, the state unchanged; [] where nothing is forced or the backend cannot say.
        What follows the forced text may merge with its last token, so that one is left out."""
        return []

    # The batch operation: a backend that can fill many rows at once (on its own threads)
    # overrides it; the default fills them one by one.
    parallel_fill = False
    """Whether :meth:`fill_next_token_bitmasks` fills rows in parallel (else one by one)."""

    @classmethod
    def fill_next_token_bitmasks(
        cls,
        matchers: Sequence[GrammarMatcher],
        bitmask: torch.Tensor,
        rows: Sequence[int],
        *,
        num_threads: int,
    ) -> list[Exception | None]:
        """Fill row ``rows[i]`` of ``bitmask`` for ``matchers[i]`` (matchers of this class, none
        terminated), each as :meth:`fill_next_token_bitmask` would.

        Returns, per matcher, the exception (one of ``REQUEST_ERRORS``) its fill raised, or
        None: one matcher's failure never stops the others. ``num_threads`` bounds the threads
        of a parallel backend.
        """
        return fill_one_by_one(matchers, bitmask, rows)


def fill_one_by_one(
    matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
) -> list[Exception | None]:
    """:meth:`GrammarMatcher.fill_next_token_bitmasks` without parallelism."""
    errors: list[Exception | None] = []
    for matcher, row in zip(matchers, rows, strict=True):
        try:
            matcher.fill_next_token_bitmask(bitmask, row)
            errors.append(None)
        except REQUEST_ERRORS as exc:
            errors.append(exc)
    return errors


def check_rollback(num_tokens: int, num_accepted: int) -> None:
    """Raise ``ValueError`` unless ``0 <= num_tokens <= num_accepted``."""
    if not 0 <= num_tokens <= num_accepted:
        raise ValueError(
            f"cannot roll back {num_tokens} tokens: the matcher has accepted {num_accepted}"
        )


class WrappedMatcher(GrammarMatcher):
    """A matcher that forwards every call to ``inner``: a base for one that observes a call
    (times its mask fills, counts them) and leaves the rest as they are."""

    def __init__(self, inner: GrammarMatcher) -> None:
        self.inner = inner
        self.backend = inner.backend

    def accept_token(self, token_id: int) -> bool:
        return self.inner.accept_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)

    def error(self) -> str | None:
        return self.inner.error()

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        self.inner.fill_next_token_bitmask(bitmask, index)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def completes(self, tokens: Sequence[int]) -> bool:
        return self.inner.completes(tokens)

    def forced_tokens(self) -> list[int]:
        return self.inner.forced_tokens()


CompiledGuide = object
"""What a backend compiles a guide into (xgrammar's ``CompiledGrammar``, a template llguidance
matcher): opaque outside its backend."""


class GrammarMatcherFactory(ABC):
    """Compiles guides (with a cache) and hands out fresh matchers.

    ``compile`` does the costly part once per guide (an engine runs it off its step loop, as a
    request arrives); ``create`` then makes a request's matcher from the cached result.
    """

    config: GuidedDecodingConfig
    """The settings the factory was built from (backend, tokenizer, cache, limits)."""
    isolation: CompileProbe | None = None
    """Where each new guide is compiled first, apart from this process (a backend crash or
    hang fails that guide alone; see :mod:`guidedec.grammar.isolation`); None: in this process
    only. The factory owns it: :meth:`close` stops it."""

    @abstractmethod
    def compile(self, params: GuidedDecodingParams) -> CompiledGuide:
        """Compile ``params``' guide, or find it in the cache (keyed by the canonical guide).

        Raises:
            GrammarError: the guide cannot be compiled; the message names the problem.
        """

    @abstractmethod
    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        """A matcher at the start of ``params``' guide (compiled first unless cached).

        Raises:
            GrammarError: the guide cannot be compiled; the message names the problem.
        """

    def warm_up(self) -> None:
        """Build now what a first compile would build whatever the guide (a backend's view of
        the tokenizer: about a second of Python for a 129k vocabulary, holding the GIL), so that
        no request pays for it while others run. A backend's factory does it when constructed;
        ``auto`` builds its backends' factories here."""
        return  # nothing to build by default

    def forget(self, params: GuidedDecodingParams) -> None:
        """Drop ``params``' compiled guide from the cache, and give back the memory it held
        (the next request with it compiles it again): for a guide that failed its request in a
        way it would fail every request (masks too slow to use), whose grammar state can grow
        past what the cache counts for it. Nothing to drop by default."""
        return

    def close(self) -> None:
        """Stop the compile isolation's workers, if the factory has them."""
        if self.isolation is not None:
            self.isolation.close()


class WrappedFactory(GrammarMatcherFactory):
    """A factory that forwards every call to ``inner``: a base for one that observes its
    compiles or wraps the matchers it hands out."""

    def __init__(self, inner: GrammarMatcherFactory) -> None:
        self.inner = inner
        self.config = inner.config
        self.isolation = inner.isolation

    def close(self) -> None:
        self.inner.close()

    def compile(self, params: GuidedDecodingParams) -> CompiledGuide:
        return self.inner.compile(params)

    def create(self, params: GuidedDecodingParams) -> GrammarMatcher:
        return self.inner.create(params)

    def warm_up(self) -> None:
        self.inner.warm_up()

    def forget(self, params: GuidedDecodingParams) -> None:
        self.inner.forget(params)
