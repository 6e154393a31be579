"""How a rollout shows itself: phase, per-version counts, gate verdicts, an estimated
completion time, and conditions as a Deployment's (Progressing, Available, Halted)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal

from shadowpod.fleet.followers import Follower
from shadowpod.fleet.state import RolloutState
from shadowpod.fleet.strategy import Pause, RolloutStrategy

# Rejections shown in status: the latest few say enough, and the status stays small.
RECENT_REJECTIONS: Final = 5


class RolloutPhase(StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    HALTED = "Halted"
    ABORTING = "Aborting"
    ABORTED = "Aborted"
    COMPLETE = "Complete"


@dataclass(frozen=True)
class Rejection:
    session: str
    judge: str
    message: str


@dataclass(frozen=True)
class GateVerdicts:
    """The upgrade gates' verdicts on this rollout's moves."""

    passed: int = 0
    rejected: int = 0
    recent_rejections: tuple[Rejection, ...] = ()


@dataclass(frozen=True)
class Progress:
    phase: RolloutPhase
    step: int
    steps: int  # the user's steps plus the final "all sessions"
    step_description: str
    message: str
    versions: tuple[tuple[str, int], ...]  # every follower's version, most common first
    total: int
    updated: int  # on the rollout's target
    pinned: int
    queued: int
    running: int
    failed: int
    unavailable: int
    suspended: int = 0  # no owner on purpose: they resume on the rollout's version
    waiting: tuple[tuple[str, int], ...] = ()  # why sessions that must move do not yet
    gates: GateVerdicts = field(default_factory=GateVerdicts)
    estimated_completion: float | None = None


@dataclass(frozen=True)
class ConditionValue:
    type: Literal["Progressing", "Available", "Halted"]
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def version_counts(followers: Sequence[Follower]) -> tuple[tuple[str, int], ...]:
    counts = Counter(follower.version for follower in followers)
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def gate_verdicts(followers: Sequence[Follower], revision: int) -> GateVerdicts:
    passed = rejected = 0
    rejections: list[tuple[float, Rejection]] = []
    for follower in followers:
        last = follower.last
        if last is None or last.revision != revision or last.verdict is None:
            continue
        if last.verdict.passed:
            passed += 1
        else:
            rejected += 1
            rejections.append(
                (
                    last.finished_at,
                    Rejection(follower.name, last.verdict.judge, last.verdict.message),
                )
            )
    rejections.sort(key=lambda item: (-item[0], item[1].session))
    recent = tuple(rejection for _, rejection in rejections[:RECENT_REJECTIONS])
    return GateVerdicts(passed=passed, rejected=rejected, recent_rejections=recent)


def estimated_completion(
    followers: Sequence[Follower],
    state: RolloutState,
    strategy: RolloutStrategy,
    remaining: int,
    now: float,
) -> float | None:
    """When the rollout should be done: the remaining moves in waves of the rollout's
    concurrency, each as long as this rollout's moves took on average, plus the timed
    pauses still ahead. None while no move has finished yet (nothing to go by) or when
    a pause ahead waits for a person."""
    if remaining == 0:
        return now
    durations = [
        follower.last.duration_seconds
        for follower in followers
        if follower.last is not None
        and follower.last.revision == state.revision
        and follower.last.succeeded
    ]
    if not durations:
        return None
    pauses = 0.0
    for index in range(state.step, len(strategy.steps)):
        step = strategy.steps[index]
        if not isinstance(step, Pause):
            continue
        if step.seconds is None:
            return None
        started = state.step_started_at if index == state.step else None
        pauses += step.seconds if started is None else max(0.0, started + step.seconds - now)
    waves = math.ceil(remaining / strategy.pace.max_concurrent)
    return now + pauses + waves * (sum(durations) / len(durations))


# Progressing by phase, as a Deployment's: True while it moves (and once complete, with
# the reason saying so), Unknown while a pause waits, False when it stopped short.
_PROGRESSING: Final[dict[RolloutPhase, tuple[Literal["True", "False", "Unknown"], str]]] = {
    RolloutPhase.PROGRESSING: ("True", "RollingOut"),
    RolloutPhase.PAUSED: ("Unknown", "RolloutPaused"),
    RolloutPhase.HALTED: ("False", "RolloutHalted"),
    RolloutPhase.ABORTING: ("True", "RollingBack"),
    RolloutPhase.ABORTED: ("False", "RolloutAborted"),
    RolloutPhase.COMPLETE: ("True", "RolloutComplete"),
}


def conditions(
    progress: Progress, state: RolloutState, max_unavailable: int
) -> tuple[ConditionValue, ...]:
    """Progressing, Available and Halted, each always set (API conventions)."""
    phase = progress.phase
    progressing = _PROGRESSING[phase]
    available: tuple[Literal["True", "False"], str, str] = (
        (
            "True",
            "SessionsServing",
            f"{progress.total - progress.unavailable - progress.suspended} of"
            f" {progress.total} sessions serving"
            + (f", {progress.suspended} suspended" if progress.suspended else ""),
        )
        if progress.unavailable <= max_unavailable
        else (
            "False",
            "SessionsUnavailable",
            f"{progress.unavailable} sessions have no serving owner, more than"
            f" maxUnavailable {max_unavailable}",
        )
    )
    if state.halted is not None and phase is RolloutPhase.HALTED:
        halted = ConditionValue("Halted", "True", state.halted.reason.value, state.halted.message)
    else:
        halted = ConditionValue("Halted", "False", "WithinFailureBudget", "")
    return (
        ConditionValue("Progressing", progressing[0], progressing[1], progress.message),
        ConditionValue("Available", *available),
        halted,
    )
