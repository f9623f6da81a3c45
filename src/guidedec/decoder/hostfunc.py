"""Host functions: Python callables enqueued on a CUDA stream, so that they run in stream order
and inside CUDA graphs (a captured launch becomes a host node that runs at every replay).

``launch_host_func(stream, fn)`` calls ``cudaLaunchHostFunc`` of the CUDA runtime that torch has
loaded, through ``ctypes``: one C trampoline for the process, and a handle per callable as its
``userData``. A launch made while the stream is capturing keeps its callable for the life of the
process (the graph may replay it at any time); any other launch frees it after it has run.

A callable runs on a CUDA driver thread and takes the GIL there. An exception cannot cross back
into CUDA: it is kept and re-raised by :func:`raise_pending_error` (the decoders call it when they
next synchronize). The caller must never block on the stream while holding the GIL before its
host functions have run (see ``CapturableGuidedDecoder.drain_host_functions``).

:func:`hostfunc` makes a decoder method launchable: on a CUDA decoder, calling it enqueues it on
the current stream and returns None; on the CPU it runs at once. ``method.run_now`` runs it
directly wherever the decoder is, which is how the host functions are unit-tested in the order a
graph would run them.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from guidedec.decoder.streams import StepSync

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_lock = threading.Lock()
_callables: dict[int, tuple[Callable[[], object], bool]] = {}  # handle -> (fn, keep)
_handles = itertools.count(1)
_errors: list[BaseException] = []


class HostFunctionError(RuntimeError):
    """A host function raised; the original exception is its ``__cause__``."""


def _run(user_data: int | None) -> None:
    """The C trampoline's body: run the callable registered under ``user_data``."""
    with _lock:
        entry = _callables.get(int(user_data or 0))
        if entry is not None and not entry[1]:
            del _callables[int(user_data or 0)]
    if entry is None:
        return
    try:
        entry[0]()
    except BaseException as exc:  # nothing may propagate into the CUDA runtime
        with _lock:
            _errors.append(exc)


_TRAMPOLINE = _HOST_FN(_run)


def raise_pending_error() -> None:
    """Re-raise the first exception a host function raised since the last call (then forget
    them all)."""
    with _lock:
        errors = list(_errors)
        _errors.clear()
    if errors:
        raise HostFunctionError(
            f"a host function failed ({len(errors)} in all): {errors[0]!r}"
        ) from errors[0]


@functools.cache
def _cudart() -> Any:
    """The CUDA runtime library torch has loaded (found in this process's memory map)."""
    torch.cuda.init()  # type: ignore[no-untyped-call]
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split()[-1]
            if "libcudart" in Path(path).name:
                lib = ctypes.CDLL(path)
                break
        else:
            lib = ctypes.CDLL("libcudart.so")
    else:
        lib = ctypes.CDLL("libcudart.so")
    lib.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
    lib.cudaLaunchHostFunc.restype = ctypes.c_int
    return lib


def launch_host_func(stream: torch.cuda.Stream, fn: Callable[[], object]) -> None:
    """Enqueue ``fn`` on ``stream`` (captured as a host node when the stream is capturing)."""
    keep = torch.cuda.is_current_stream_capturing()
    with _lock:
        handle = next(_handles)
        _callables[handle] = (fn, keep)
    status = _cudart().cudaLaunchHostFunc(stream.cuda_stream, _TRAMPOLINE, handle)
    if status != 0:
        with _lock:
            _callables.pop(handle, None)
        raise RuntimeError(f"cudaLaunchHostFunc failed with CUDA error {status}")


class _HasDevice(Protocol):
    @property
    def device(self) -> torch.device: ...

    @property
    def sync(self) -> StepSync: ...


S = TypeVar("S", bound=_HasDevice)


def hostfunc(method: Callable[[S], None]) -> Callable[[S], None]:
    """Make ``method`` (no arguments but the decoder) a host function of the decoder's stream."""

    def run_now(decoder: S) -> None:
        decoder.sync.note(f"host: {method.__name__}")
        method(decoder)

    @functools.wraps(method)
    def launch(decoder: S) -> None:
        if decoder.device.type == "cuda":
            stream = torch.cuda.current_stream(decoder.device)
            launch_host_func(stream, functools.partial(run_now, decoder))
        else:
            run_now(decoder)

    launch.run_now = run_now  # type: ignore[attr-defined]
    return launch
