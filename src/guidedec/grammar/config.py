"""GuidedDecodingConfig: engine-wide settings of guided decoding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

from guidedec.errors import GrammarError
from guidedec.grammar.limits import GuideLimits
from guidedec.grammar.params import GuidedDecodingParams
from guidedec.tokenizer import TokenizerInfo

BackendName = Literal["xgrammar", "llguidance", "auto"]
WhitespaceMode = Literal["flexible", "compact"]
FillMode = Literal["auto", "parallel", "sequential"]
ExactBackendName = Literal["xgrammar", "llguidance"]

BACKENDS: tuple[str, ...] = get_args(BackendName)


class ProbedGuide(Protocol):
    """What a compile probe measured of a guide."""

    @property
    def heap_bytes(self) -> int | None:
        """The C heap the compiled guide held after its first mask; None: not known."""


class CompileProbe(Protocol):
    """What the backends ask of compile isolation
    (:class:`guidedec.grammar.isolation.CompileIsolation`), which their factory holds (see
    :func:`guidedec.create_grammar_matcher_factory`)."""

    def probe(
        self, backend: str, params: GuidedDecodingParams, config: GuidedDecodingConfig
    ) -> ProbedGuide:
        """Compile ``params`` with ``backend`` apart from this process, or raise
        :class:`~guidedec.errors.GrammarError`."""

    def close(self) -> None:
        """Stop what it runs."""


@dataclass(frozen=True, kw_only=True)
class GuidedDecodingConfig:
    """Settings shared by every request of an engine.

    Args:
        backend: ``"xgrammar"``, ``"llguidance"`` or ``"auto"``: per guide, the backend that
            enforces it exactly, falling back to the other one when it refuses (see
            :mod:`guidedec.grammar.auto`).
        tokenizer: The tokenizer, padded vocabulary size and stop tokens.
        cache_limit_bytes: Byte budget of the compiled-grammar cache (least recently used first
            out).
        max_rollback_tokens: The longest rollback the caller will ask of a matcher (the number of
            draft tokens in speculative decoding); both backends keep at least that much history.
        json_whitespace: Whitespace that JSON guides allow between tokens. ``"flexible"``
            (default) allows runs of at most ``max_json_whitespace`` whitespace characters
            (space, tab, CR, LF) wherever JSON allows whitespace, so the model can indent as it
            was trained to but can never loop on whitespace; ``"compact"`` allows none.
        max_json_whitespace: The longest whitespace run in ``"flexible"`` mode.
        approximate: For ``"auto"``, when no backend enforces a JSON schema exactly (llguidance
            refuses a construct that xgrammar only approximates, such as ``not``): ``True``
            (default) guides with xgrammar's approximation, whose outputs may not validate;
            ``False`` fails the request, naming both reasons, so that every output validates.
        auto_prefers: For ``"auto"``, the backend tried first for a JSON guide that both
            enforce exactly: ``"xgrammar"`` (default; its masks are faster) or
            ``"llguidance"`` (its masks keep forced text in the tokenizer's own split, so the
            drafts of jump-forward are accepted; ``LLM``'s default).
        fill_mode: How a decoder fills the rows of a batch: ``"auto"`` (default) times the
            backends' parallel batch calls against one row at a time on the live batches and
            keeps the faster (see :mod:`guidedec.grammar.batch_fill`); ``"parallel"`` or
            ``"sequential"`` force one way. The masks are the same either way.
        fill_threads: Threads of a parallel fill (default: the CPUs this process may use, at
            most 16; 1 means sequential).
        limits: Limits on a guide's size and shape, checked before any backend sees it (see
            :mod:`guidedec.grammar.limits` for the defaults and why).
        compile_cache_dir: A directory where xgrammar's compiled grammars are kept across
            restarts and shared by processes (see :mod:`guidedec.grammar.disk_cache`); None
            (default): in memory only.
        mask_time_limit_ms: A request whose token masks take longer than this three times in a
            row, after its first, ends with ``grammar_error``: a guide whose masks cost tens of
            milliseconds (the Lark regex ``/(a{700}){700}/``) would hold every request of the
            batch at that pace. Masks of real guides take microseconds (4.6 ms on average for
            the slowest schema of the shared data). Fills are timed one by one from a build
            slower than 4 ms (or than the limit) until 64 fast builds in a row (a build of fast
            masks pays nothing), where a batch's rows are filled one at a time (fewer than four
            guided rows, or ``fill_mode="sequential"``). The same times pace a request whose
            masks are slow but under the limit (see :mod:`guidedec.engine.pacing`). None: no
            limit.
    """

    backend: BackendName = "auto"
    tokenizer: TokenizerInfo
    cache_limit_bytes: int = 1 << 30
    max_rollback_tokens: int = 0
    json_whitespace: WhitespaceMode = "flexible"
    max_json_whitespace: int = 20
    approximate: bool = True
    auto_prefers: ExactBackendName = "xgrammar"
    fill_mode: FillMode = "auto"
    fill_threads: int | None = None
    limits: GuideLimits = field(default_factory=GuideLimits)
    mask_time_limit_ms: float | None = 20.0
    compile_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise GrammarError(
                f"unknown guided decoding backend {self.backend!r}; choose one of {list(BACKENDS)}"
            )
        if self.json_whitespace not in get_args(WhitespaceMode):
            raise ValueError(
                f"json_whitespace must be 'flexible' or 'compact', got {self.json_whitespace!r}"
            )
        if self.max_json_whitespace < 1:
            raise ValueError(f"max_json_whitespace must be >= 1, got {self.max_json_whitespace}")
        if self.auto_prefers not in get_args(ExactBackendName):
            raise ValueError(
                "auto_prefers must be one of "
                f"{list(get_args(ExactBackendName))}, got {self.auto_prefers!r}"
            )
        if self.fill_mode not in get_args(FillMode):
            raise ValueError(
                f"fill_mode must be one of {list(get_args(FillMode))}, got {self.fill_mode!r}"
            )
        if self.fill_threads is not None and self.fill_threads < 1:
            raise ValueError(f"fill_threads must be >= 1, got {self.fill_threads}")
        if self.mask_time_limit_ms is not None and not self.mask_time_limit_ms > 0:
            raise ValueError(f"mask_time_limit_ms must be > 0, got {self.mask_time_limit_ms}")
        if self.cache_limit_bytes < 0 or self.max_rollback_tokens < 0:
            raise ValueError("cache_limit_bytes and max_rollback_tokens must be non-negative")

    @property
    def json_whitespace_limit(self) -> int:
        """Longest whitespace run a JSON guide allows (0 in compact mode)."""
        return 0 if self.json_whitespace == "compact" else self.max_json_whitespace
