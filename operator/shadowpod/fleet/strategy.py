"""A rollout strategy as users write it: canary steps, pauses, a pace and a failure budget.

Steps run in order. A canary step raises the number of sessions on the new version to
N sessions or P% of the sessions that may move (pinned ones never do); a pause waits a
time, or until someone resumes the rollout. After the last step the rest follow in
batches at the pace. Every step, the final batches included, has a failure budget: more
than ``failure_budget`` migrations of the step rolled back or failed halt the rollout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from shadowpod.domain.errors import ShadowpodError

# Upper bounds a strategy may ask for: well above any fleet, low enough to catch a typo
# (a pause of 10^9 s, a cap of 10^6 concurrent moves) before it is taken literally.
MAX_STEPS: Final = 64
MAX_PAUSE_SECONDS: Final = 7 * 86_400
MAX_CONCURRENCY: Final = 10_000
MAX_SESSIONS: Final = 1_000_000


class StrategyError(ShadowpodError, ValueError):
    """A strategy that cannot be followed; the message names the field and what to do."""

    reason = "InvalidRolloutStrategy"


@dataclass(frozen=True)
class Canary:
    """Raise the sessions on the new version to ``sessions`` or ``percent``% of the
    sessions that may move (rounded up, so 1% of 50 is one session)."""

    sessions: int | None = None
    percent: int | None = None

    def __post_init__(self) -> None:
        if (self.sessions is None) == (self.percent is None):
            raise StrategyError(
                "a canary step takes sessions (a number) or percent, not both nor neither:"
                " write canary: {sessions: 1} or canary: {percent: 10}"
            )
        if self.sessions is not None and not 1 <= self.sessions <= MAX_SESSIONS:
            raise StrategyError(
                f"canary.sessions is {self.sessions}: give 1 to {MAX_SESSIONS}"
                " (sessions on the new version when the step ends)"
            )
        if self.percent is not None and not 1 <= self.percent <= 100:
            raise StrategyError(
                f"canary.percent is {self.percent}: give 1 to 100 (the share of the sessions"
                " that may move, on the new version when the step ends)"
            )

    def goal(self, movable: int) -> int:
        """How many of ``movable`` sessions are on the new version when the step is done."""
        if self.sessions is not None:
            return min(self.sessions, movable)
        assert self.percent is not None
        return min(movable, math.ceil(movable * self.percent / 100))

    def describe(self) -> str:
        if self.sessions is not None:
            return f"canary {self.sessions} session{'s' if self.sessions != 1 else ''}"
        return f"canary {self.percent}%"


@dataclass(frozen=True)
class Pause:
    """Wait ``seconds``, or until the rollout is resumed when ``seconds`` is None."""

    seconds: int | None = None

    def __post_init__(self) -> None:
        if self.seconds is not None and not 1 <= self.seconds <= MAX_PAUSE_SECONDS:
            raise StrategyError(
                f"pause.durationSeconds is {self.seconds}: give 1 to {MAX_PAUSE_SECONDS}"
                " (a week), or leave it out to pause until the rollout is resumed"
            )

    def describe(self) -> str:
        return f"pause {self.seconds}s" if self.seconds is not None else "pause until resumed"


Step = Canary | Pause


@dataclass(frozen=True)
class Pace:
    """How fast one rollout moves sessions.

    ``max_concurrent`` and ``max_per_node`` bound the rollout's own migrations that are
    queued or running (the cluster-wide queue bounds all migrations on top of this);
    ``max_unavailable`` is how many of the sessions the rollout touches may be without a
    serving owner before it starts no more moves. A live move keeps serving, so 0 holds.
    """

    max_concurrent: int = 10
    max_per_node: int = 2
    max_unavailable: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.max_concurrent <= MAX_CONCURRENCY:
            raise StrategyError(
                f"maxConcurrentMigrations is {self.max_concurrent}: give 1 to {MAX_CONCURRENCY}"
            )
        if not 1 <= self.max_per_node <= MAX_CONCURRENCY:
            raise StrategyError(
                f"maxConcurrentPerNode is {self.max_per_node}: give 1 to {MAX_CONCURRENCY}"
            )
        if self.max_per_node > self.max_concurrent:
            raise StrategyError(
                f"maxConcurrentPerNode ({self.max_per_node}) exceeds maxConcurrentMigrations"
                f" ({self.max_concurrent}): one node can never have more moves than the whole"
                " rollout; lower maxConcurrentPerNode"
            )
        if not 0 <= self.max_unavailable <= MAX_SESSIONS:
            raise StrategyError(
                f"maxUnavailable is {self.max_unavailable}: give 0 (the default: a live move"
                f" keeps serving) to {MAX_SESSIONS}"
            )


@dataclass(frozen=True)
class RolloutStrategy:
    """The steps, the pace and the failure budget (rollbacks tolerated per step)."""

    steps: tuple[Step, ...] = ()
    pace: Pace = field(default_factory=Pace)
    failure_budget: int = 0

    def __post_init__(self) -> None:
        if len(self.steps) > MAX_STEPS:
            raise StrategyError(
                f"{len(self.steps)} steps: a strategy has at most {MAX_STEPS}; merge some"
            )
        if not 0 <= self.failure_budget <= MAX_SESSIONS:
            raise StrategyError(
                f"failureBudget is {self.failure_budget}: give 0 (halt on the first rollback)"
                f" to {MAX_SESSIONS}"
            )
        previous: Canary | None = None
        for index, step in enumerate(self.steps):
            if not isinstance(step, Canary):
                continue
            if previous is not None and _shrinks(previous, step):
                raise StrategyError(
                    f"step {index} ({step.describe()}) is smaller than an earlier step"
                    f" ({previous.describe()}): a rollout only moves sessions forward; give"
                    " each canary step at least the previous step's size"
                )
            previous = step

    @property
    def final_step(self) -> int:
        """The index of the implicit last step: everything left, in batches."""
        return len(self.steps)

    def describe(self, index: int) -> str:
        if index >= len(self.steps):
            return "all sessions"
        return self.steps[index].describe()


def _shrinks(before: Canary, after: Canary) -> bool:
    """Whether ``after`` asks for fewer sessions than ``before``, when that is knowable
    without the fleet's size (a count after a percentage depends on it)."""
    if before.sessions is not None and after.sessions is not None:
        return after.sessions < before.sessions
    if before.percent is not None and after.percent is not None:
        return after.percent < before.percent
    return False
