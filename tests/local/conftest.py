"""Live scenarios for the local runtime's own tests (the engine's fixture, reused)."""

from tests.engine.conftest import scenario

__all__ = ["scenario"]
