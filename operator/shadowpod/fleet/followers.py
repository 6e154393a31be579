"""What the planner reads: the sessions that follow a template, as last observed.

Times are seconds since the epoch (floats): the operator converts the API's RFC 3339
times at its edge, and tests drive a clock of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class FailureKind(StrEnum):
    """Why a move of the rollout did not reach its version: the halt reason it gives."""

    GATE_REJECTED = "GateRejected"
    SCHEMA_INCOMPATIBLE = "SchemaIncompatible"
    TIMED_OUT = "TimedOut"
    MIGRATION_FAILED = "MigrationFailed"
    # The gate had no live turn to judge (no client traffic in its window): not a
    # rejection of the version, an analysis that could not conclude (Argo Rollouts'
    # Inconclusive). It halts at once, counts against no budget, and a resume retries.
    NO_LIVE_TURNS = "NoLiveTurns"


# The migration engine's reasons (engine/failures.py, engine/ports.py) by what they
# say about the new version; any other reason is an ordinary failed migration.
_KIND_OF_REASON: Final = {
    "ValidationFailed": FailureKind.GATE_REJECTED,
    "PersonaDrift": FailureKind.GATE_REJECTED,
    "IncompatibleStateSchema": FailureKind.SCHEMA_INCOMPATIBLE,
    "PhaseTimeout": FailureKind.TIMED_OUT,
    "MaxDurationExceeded": FailureKind.TIMED_OUT,
    "FenceTimeout": FailureKind.TIMED_OUT,
}


def failure_kind(reason: str | None, verdict: Verdict | None = None) -> FailureKind:
    if reason == "ValidationFailed" and verdict is not None and verdict.inconclusive:
        return FailureKind.NO_LIVE_TURNS
    return _KIND_OF_REASON.get(reason or "", FailureKind.MIGRATION_FAILED)


class MoveState(StrEnum):
    QUEUED = "Queued"  # waiting in the cluster-wide pacing queue
    RUNNING = "Running"


@dataclass(frozen=True)
class Verdict:
    """An upgrade gate's judgement of one move (spec.migration.validation)."""

    passed: bool
    judge: str
    agreement: float | None = None
    message: str = ""
    # No live turn was compared (and no golden failed): nothing was judged.
    inconclusive: bool = False


@dataclass(frozen=True)
class Move:
    """A migration of the session not finished yet. ``revision`` is the rollout revision
    that created it (the migration's label), None for a move the rollout did not make
    (a node drain, a user's AgentMigration)."""

    migration: str
    target: str
    state: MoveState
    revision: int | None = None


@dataclass(frozen=True)
class Outcome:
    """The session's latest finished migration."""

    migration: str
    target: str
    succeeded: bool
    finished_at: float
    duration_seconds: float
    revision: int | None = None
    reason: str | None = None  # the engine's reason when it did not succeed
    message: str = ""
    verdict: Verdict | None = None


@dataclass(frozen=True)
class Follower:
    """A session following the template: the version its owner runs, where, and how its
    moves went. ``serving``: an owner answers (its Ready condition). ``suspended``: no
    owner runs on purpose (``operatingMode: Suspended``): it is neither unavailable nor
    moved, and starts on the version the rollout says when it resumes."""

    name: str
    version: str
    node: str | None = None
    pinned: bool = False
    serving: bool = True
    suspended: bool = False
    move: Move | None = None
    last: Outcome | None = None
