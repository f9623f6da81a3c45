"""Token bitmasks: layout, validity check and the kernels that apply them to logits."""

from guidedec.bitmask.apply import apply_bitmask
from guidedec.bitmask.buffer import MaskBuffer
from guidedec.bitmask.layout import (
    BITMASK_DTYPE,
    HostRowChecker,
    allocate_bitmask,
    bitmask_size,
    row_has_valid_token,
    token_word,
)
from guidedec.bitmask.sharding import VocabShard, apply_bitmask_sharded, vocab_shard
from guidedec.bitmask.sparse import sparse_allowed_tokens

__all__ = [
    "BITMASK_DTYPE",
    "HostRowChecker",
    "MaskBuffer",
    "VocabShard",
    "allocate_bitmask",
    "apply_bitmask",
    "apply_bitmask_sharded",
    "bitmask_size",
    "row_has_valid_token",
    "sparse_allowed_tokens",
    "token_word",
    "vocab_shard",
]
