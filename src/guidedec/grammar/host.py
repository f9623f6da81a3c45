"""The operating system's levers the grammar layer pulls: the C heap (how much it holds, giving
freed pages back), thread priority, address-space limits, and worker processes' lives. Linux
and glibc where they exist; elsewhere each does nothing, or says it cannot tell."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import threading
from multiprocessing.connection import Connection
from typing import Any

COMPILE_NICENESS = 10
"""How much lower than the engine's the priority of compile work is: a long compile takes the
CPU the steps of running requests leave, not theirs."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_in_use() -> int | None:
    """Bytes the C heap has handed out (glibc's ``mallinfo2``: small blocks and mmapped ones),
    which the backends' native allocations go through; None without glibc 2.33."""
    mallinfo2 = _libc_function("mallinfo2", _MallInfo2)
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the system where the C library can (glibc's
    ``malloc_trim``): the backends allocate through it, and without this a process keeps the
    peak of what a dropped grammar held."""
    trim = _libc_function("malloc_trim", ctypes.c_int)
    if trim is not None:
        trim(0)


@functools.cache
def _libc_function(name: str, restype: Any) -> Any:
    """The C library's function ``name`` returning ``restype``; None where there is none."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None
    function.restype = restype
    return function


def lower_priority() -> None:
    """Lower the calling thread's CPU priority by ``COMPILE_NICENESS`` (Linux: per thread;
    elsewhere nothing)."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + COMPILE_NICENESS))


def limit_memory(extra: int) -> None:
    """Cap the process's address space at its size now plus ``extra`` bytes (a compile worker:
    a guide that would take more fails, not the machine)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + extra
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def stop_worker(process: Any, conn: Connection | None, timeout_s: float = 2.0) -> None:
    """Ask a worker to leave (``None`` on its pipe, when given), then kill it if it has not
    within ``timeout_s``."""
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.send(None)
    process.join(timeout=timeout_s)
    if process.is_alive():
        process.kill()
        process.join()


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a worker leaves once its parent is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
