"""What a benchmark report records about the machine and the software it ran on."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

import torch

from guidedec.version import __version__


def environment() -> dict[str, Any]:
    """Versions (Python, torch, xgrammar, llguidance, guidedec), torch threads, CPU count,
    load average and machine."""
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "xgrammar": importlib.metadata.version("xgrammar"),
        "llguidance": importlib.metadata.version("llguidance"),
        "guidedec": __version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "machine": platform.processor() or platform.machine(),
    }
