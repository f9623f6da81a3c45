"""The installed guidedec's version (``pyproject.toml`` holds the one copy)."""

from __future__ import annotations

import importlib.metadata

try:
    __version__ = importlib.metadata.version("guidedec")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a bare source tree
    __version__ = "0+unknown"
