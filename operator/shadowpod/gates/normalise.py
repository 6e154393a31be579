"""Text normalisation for judges: what may differ between two runs of the same agent.

Case and whitespace never matter; spans that are nondeterministic by nature —
timestamps, UUIDs, long hex ids, and whatever the agent declares
(``agent.nondeterministic(...)``) or the policy adds — are masked to a placeholder
before texts are compared.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

from pydantic import JsonValue

BUILTIN_PATTERNS: Final[tuple[str, ...]] = (
    # ISO 8601 date-times, with optional fraction and zone
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?",
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
    r"\b[0-9a-fA-F]{16,}\b",
)
MASK: Final = "<*>"
_SPACE: Final = re.compile(r"\s+")


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """Compiled patterns; a bad one is a ``ValueError`` naming it."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"nondeterministic pattern {pattern!r} is not a regex: {exc}") from exc
    return compiled


class Normaliser:
    def __init__(self, patterns: Sequence[str] = (), *, builtin: bool = True) -> None:
        self.patterns = [*(BUILTIN_PATTERNS if builtin else ()), *patterns]
        self._compiled = compile_patterns(self.patterns)

    def text(self, text: str) -> str:
        for pattern in self._compiled:
            text = pattern.sub(MASK, text)
        return _SPACE.sub(" ", text).strip().casefold()

    def value(self, value: JsonValue) -> JsonValue:
        """A JSON value with every string in it normalised (tool call arguments)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        return value
