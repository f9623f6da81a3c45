"""Helpers for tests and benchmarks, shipped with the package so that users can reuse them.

- :mod:`~guidedec.testing.decoders`: ``make_decoder``, one way to build a decoder;
- :mod:`~guidedec.testing.masks`: packing, unpacking and random token bitmasks;
- :mod:`~guidedec.testing.matchers`: feeding tokens to matchers and reading their masks;
- :mod:`~guidedec.testing.generate`: random-logits guided generation (soundness checks);
- :mod:`~guidedec.testing.speculative`: a scripted target model, drafters and a greedy runner
  that prove speculative decoding exact;
- :mod:`~guidedec.testing.faults`: fault injection, a backend failure at any matcher call site.
"""

from guidedec.testing.decoders import make_decoder
from guidedec.testing.generate import (
    EngineChecks,
    GeneratedOutput,
    host_row_token_ids,
    random_guided_generate,
    sample_allowed_token,
    sample_from_logits,
    uniform_guided_generate,
)
from guidedec.testing.masks import (
    bitmask_to_bool_mask,
    bool_mask_to_bitmask,
    mixed_density_bitmask,
    random_bitmask,
    random_bool_mask,
)
from guidedec.testing.matchers import (
    SlowMasks,
    accepts_output,
    allowed_token_ids,
    feed_tokens,
    next_token_mask,
)
from guidedec.testing.speculative import (
    Drafter,
    GreedyDrafter,
    GreedyRunner,
    RandomDrafter,
    RunnerStats,
    ScriptedTarget,
    oracle_rows,
)

__all__ = [
    "Drafter",
    "EngineChecks",
    "GeneratedOutput",
    "GreedyDrafter",
    "GreedyRunner",
    "RandomDrafter",
    "RunnerStats",
    "ScriptedTarget",
    "SlowMasks",
    "accepts_output",
    "allowed_token_ids",
    "bitmask_to_bool_mask",
    "bool_mask_to_bitmask",
    "feed_tokens",
    "host_row_token_ids",
    "make_decoder",
    "mixed_density_bitmask",
    "next_token_mask",
    "oracle_rows",
    "random_bitmask",
    "random_bool_mask",
    "random_guided_generate",
    "sample_allowed_token",
    "sample_from_logits",
    "uniform_guided_generate",
]
