"""NVTX ranges on the decoder's phases; free when CUDA is absent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from typing import Any

import torch


@cache
def _cuda_present() -> bool:
    return torch.cuda.is_available()


_NO_RANGE = contextlib.nullcontext()  # reusable: it holds no state


def nvtx_range(name: str) -> contextlib.AbstractContextManager[None]:
    """An NVTX range named ``name`` when CUDA is available, else a no-op context."""
    if not _cuda_present():
        return _NO_RANGE
    return _pushed_range(name)


@contextlib.contextmanager
def _pushed_range(name: str) -> Iterator[None]:
    nvtx: Any = torch.cuda.nvtx
    nvtx.range_push(name)
    try:
        yield
    finally:
        nvtx.range_pop()
