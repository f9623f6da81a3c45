"""The tuning constants of budget-aware closing, in one place: where its checks start, what it
keeps, and how far and how long its search goes. Modules read them as ``settings.NAME`` at use,
so a test or a benchmark may set one for a run."""

from __future__ import annotations

# --- when closing acts, and what it keeps (see closer and witness) ------------------------------

WINDOW = 64
"""Tokens left at which a request's first search runs, for a guide whose reach is shorter."""
MARGIN = 2
"""Room a witness must leave for the model to choose freely; with less the witness is forced."""
GUIDES_KEPT = 1024
"""Guides whose words, window and witnesses are kept (all are dropped when it fills)."""
REPLAY_SKIPS = 3
"""Leading tokens of the previous witness a replay may skip (the sampled token wrote them)."""
KEYS_KEPT = 64
"""Params objects whose guide keys are kept (they are kept alive while listed)."""
RECENT_KEPT = 8
"""Witnesses kept per guide: a search first tries those (a replay costs no mask fill)."""
RECENT_SLACK = 8
"""Room a kept witness must leave to be used: it may be longer than a fresh search's, which
matters only where the budget is close."""
ENCODINGS_KEPT = 4096
"""Texts whose encodings are kept (all are dropped when it fills)."""
THINK_ROOM = 8
"""Room a ``think_first`` output's free text leaves its value beyond the value's shortest
completion: the model writes the value in its own style (whitespace, its own digits)."""

# --- the completion search (see guidedec.decoder.closing.search) --------------------------------

BRANCHES = 3
"""Subtrees that fail per state before the search backtracks past it (a token that leads back
to a state on the path does not count)."""
MAX_CYCLE = 16
"""The longest token cycle the search recognises (see ``CompletionSearch._repeats``)."""
PER_STATE = 12
"""Allowed tokens looked at per state, in preference order."""
PROBE_CANDIDATES = 24
"""Candidates the probe tries per state (see ``CompletionSearch._probe``)."""
PROBE_TRIES = 24
"""Tries per token of the limit after which the probe gives up (a cycle of accepted tokens)."""
SLOW_SEARCH_S = 0.05
"""A search gives up after this long where its masks took over :data:`SLOW_NODE_S` each on
average: a guide whose masks take tens of milliseconds would stall its whole batch for the
search (a real guide's search reads a mask in tens of microseconds, and so never gives up)."""
SLOW_NODE_S = 1e-3
MAX_DEPTH = 192
"""The deepest the search proper goes (it recurses per token and keeps a mask row per depth);
the probe, a loop with one row, follows a witness up to the whole ``limit``."""
DEEPENING = (4, 8, 16, 32, 64, 128)
"""The depths of the search's iterative deepening, after its preferred path."""
ORDERINGS_KEPT = 64
"""Orderings of the candidates (one per set of guide words) kept."""
KIND_SCAN = 256
"""Allowed candidates looked at for distinct kinds."""
MAX_CANDIDATE_CHARS = 3
"""The longest token text among the candidates (a state allowing none of them falls back to
its lowest allowed token ids)."""
