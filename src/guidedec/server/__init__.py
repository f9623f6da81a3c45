"""An OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn)."""

from guidedec.server.app import create_app
from guidedec.server.async_engine import AsyncEngine

__all__ = ["AsyncEngine", "create_app"]
