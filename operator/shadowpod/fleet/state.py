"""What a rollout remembers between two reconciles, and what people ask of it.

``RolloutState`` is the planner's memory: the operator keeps it in the AgentDeployment's
status and hands it back on the next reconcile, so a restarted operator continues the
rollout where the status says it was. Everything else the planner needs (the sessions,
their migrations) it reads afresh each time.
"""

from __future__ import annotations

from dataclasses import dataclass

from shadowpod.fleet.followers import FailureKind


@dataclass(frozen=True)
class Failure:
    """A move of the rollout that ended without reaching its version."""

    session: str
    migration: str
    step: int
    kind: FailureKind
    message: str = ""
    # A move back during an abort: counted apart, it never halts the abort.
    aborting: bool = False


@dataclass(frozen=True)
class Halt:
    """Why the rollout stopped starting moves: too many failures in one step."""

    step: int
    reason: FailureKind
    message: str
    at: float


@dataclass(frozen=True)
class Control:
    """What people asked for, read from the AgentDeployment.

    ``paused``: start no moves (spec.paused, as a Deployment's). ``resumes``: how many
    times the rollout was resumed, ever (a counter only the plugin raises): a new
    resume ends a pause step or lifts a halt. ``abort_revision``: the revision someone
    aborted; an abort of an older revision is stale and ignored.
    """

    paused: bool = False
    resumes: int = 0
    abort_revision: int | None = None


@dataclass(frozen=True)
class RolloutState:
    """Where the rollout of ``target`` stands. ``stable`` is the version it replaces:
    an abort moves sessions back to it. ``revision`` grows by one per new target, and
    labels the rollout's migrations so their outcomes can be told from others'."""

    revision: int = 0
    target: str | None = None
    stable: str | None = None
    step: int = 0
    started_at: float | None = None
    step_started_at: float | None = None
    completed_at: float | None = None
    failures: tuple[Failure, ...] = ()
    # Failures before this index were forgiven by a resume after a halt.
    forgiven: int = 0
    resumes_seen: int = 0
    halted: Halt | None = None
    aborted: bool = False

    def failed_sessions(self) -> frozenset[str]:
        return frozenset(failure.session for failure in self.failures)

    def step_failures(self) -> tuple[Failure, ...]:
        """The current step's failures that count against its budget."""
        return tuple(
            failure
            for failure in self.failures[self.forgiven :]
            if failure.step == self.step
            and not failure.aborting
            and failure.kind is not FailureKind.NO_LIVE_TURNS
        )

    def inconclusive(self) -> tuple[Failure, ...]:
        """The moves whose gate had no live turn to judge, not yet retried by a resume."""
        return tuple(
            failure
            for failure in self.failures[self.forgiven :]
            if failure.kind is FailureKind.NO_LIVE_TURNS and not failure.aborting
        )

    def attempts(self, session: str) -> int:
        """The session's moves in this revision that ended without reaching a version."""
        return sum(1 for failure in self.failures if failure.session == session)
