"""NVTX ranges on the decoder's phases; free when CUDA is absent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX range named ``name`` when CUDA is available, else nothing."""
    if not torch.cuda.is_available():
        yield
        return
    nvtx: Any = torch.cuda.nvtx
    nvtx.range_push(name)
    try:
        yield
    finally:
        nvtx.range_pop()
