"""A tool an agent registers: what a turn runs, journaling its intent and result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import JsonValue

ToolFn = Callable[..., Awaitable[JsonValue]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    fn: ToolFn
    idempotent: bool
