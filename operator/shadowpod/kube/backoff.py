"""Per-object backoff of reconciles that fail.

A session whose spec cannot work (an image that is no reference, a Secret that does
not exist) or whose reconcile raises is not tried again on every pass: each failure
doubles the wait before the next try, from the reconcile interval up to ``MAX_S``,
so a few hostile or broken objects cost the operator little and leave its time to
the sessions that work. A change of the object's spec (a new ``generation``: the user
corrected it) is tried at once, and a success forgets the failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Final

# The longest wait between two tries of a failing object: what a fix that is not a
# spec change (a Secret created, an image pushed) may wait to be seen.
MAX_S: Final = 120.0


@dataclass
class _Failing:
    generation: int | None
    failures: int
    next_try: float


@dataclass
class FailureBackoff:
    first_s: float
    max_s: float = MAX_S
    clock: Callable[[], float] = time.monotonic
    _failing: dict[Hashable, _Failing] = field(default_factory=dict)

    def due(self, key: Hashable, generation: int | None) -> bool:
        """Whether the object may be reconciled now."""
        failing = self._failing.get(key)
        if failing is None or failing.generation != generation:
            return True  # never failed, or its spec changed since
        return self.clock() >= failing.next_try

    def failed(self, key: Hashable, generation: int | None) -> float:
        """A reconcile of the object failed: the seconds until it is tried again."""
        failing = self._failing.get(key)
        failures = (
            1 if failing is None or failing.generation != generation else failing.failures + 1
        )
        delay = min(self.first_s * 2.0 ** (failures - 1), self.max_s)
        self._failing[key] = _Failing(generation, failures, self.clock() + delay)
        return delay

    def succeeded(self, key: Hashable) -> None:
        self._failing.pop(key, None)
