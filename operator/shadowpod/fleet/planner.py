"""The rollout planner: one call per reconcile decides what a template's rollout does now.

``plan`` is a pure function of what the operator observed (the template's version, the
sessions that follow it, the strategy, what people asked) and of the state the previous
call returned. It says which sessions start moving (to become AgentMigrations, which then
wait their turn in the cluster-wide pacing queue), which queued moves to withdraw, and
the state to store. Called twice on the same observations it decides the same, so an
operator that restarts between deciding and acting just decides again.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from shadowpod.fleet.followers import FailureKind, Follower, MoveState, failure_kind
from shadowpod.fleet.progress import (
    Progress,
    RolloutPhase,
    estimated_completion,
    gate_verdicts,
    version_counts,
)
from shadowpod.fleet.state import Control, Failure, Halt, RolloutState
from shadowpod.fleet.strategy import Canary, Pause, RolloutStrategy


@dataclass(frozen=True)
class Start:
    """Move ``session`` (now on ``node``) to ``target``, as migration ``revision`` of the
    rollout: the operator labels the AgentMigration with it."""

    session: str
    target: str
    node: str | None
    revision: int
    # The session's earlier moves in this revision that did not succeed (a retry after
    # an inconclusive gate): its migration's name says which attempt it is.
    attempt: int = 0


@dataclass(frozen=True)
class Plan:
    state: RolloutState
    start: tuple[Start, ...]
    cancel: tuple[str, ...]  # the rollout's queued migrations to withdraw (none runs yet)
    progress: Progress
    # When to look again if nothing changes before (the end of a timed pause).
    wake_at: float | None = None


def plan(
    target: str,
    followers: Sequence[Follower],
    strategy: RolloutStrategy,
    state: RolloutState,
    control: Control,
    now: float,
) -> Plan:
    state = _begin(target, followers, strategy, state, now)
    state = _record_outcomes(followers, state)
    state = _apply_control(strategy, state, control, now)
    if state.aborted:
        return _abort(followers, strategy, state, now)
    return _roll_out(followers, strategy, state, control, now)


def version_for_new_session(state: RolloutState, strategy: RolloutStrategy) -> str | None:
    """The version a session created now starts on: the stable one until the canary
    steps are through (the new version is not proven yet), the new one after. None
    before any rollout: the template's version."""
    if state.target is None:
        return None
    if state.stable is not None and (
        state.aborted or state.halted is not None or state.step < strategy.final_step
    ):
        return state.stable
    return state.target


# --- state transitions -------------------------------------------------------------------


def _begin(
    target: str,
    followers: Sequence[Follower],
    strategy: RolloutStrategy,
    state: RolloutState,
    now: float,
) -> RolloutState:
    """A new target starts a new revision; the version it replaces becomes the stable
    one: the previous target if that rollout completed, else the previous stable (a bump
    in the middle of a rollout does not make the half-proven version stable). A bump
    back to the stable version in the middle of a rollout is a rollback: it skips the
    steps (the version was proven), as Argo Rollouts does, and keeps only the pace. So
    does a first rollout with no session on another version."""
    if state.target == target:
        return state
    step = 0
    if state.target is None:
        others = Counter(f.version for f in followers if f.version != target)
        stable = min(others, key=lambda v: (-others[v], v)) if others else None
        if stable is None:
            # A new template whose sessions start on its image: nothing to move from,
            # so the steps (a canary, a pause) have nothing to guard.
            step = strategy.final_step
    elif state.completed_at is not None and not state.aborted:
        stable = state.target
    else:
        stable = state.stable
        if target == stable:
            stable, step = None, strategy.final_step
    return RolloutState(
        revision=state.revision + 1,
        target=target,
        stable=stable if stable != target else None,
        step=step,
        started_at=now,
        step_started_at=now,
        resumes_seen=state.resumes_seen,
    )


def _record_outcomes(followers: Sequence[Follower], state: RolloutState) -> RolloutState:
    """Every finished move of this revision that did not reach its version, once."""
    known = {failure.migration for failure in state.failures}
    new = [
        Failure(
            session=follower.name,
            migration=follower.last.migration,
            step=state.step,
            kind=failure_kind(follower.last.reason, follower.last.verdict),
            message=follower.last.message,
            aborting=follower.last.target != state.target,
        )
        for follower in sorted(followers, key=lambda f: f.name)
        if follower.last is not None
        and follower.last.revision == state.revision
        and not follower.last.succeeded
        and follower.last.migration not in known
    ]
    if not new:
        return state
    return replace(state, failures=state.failures + tuple(new))


def _apply_control(
    strategy: RolloutStrategy, state: RolloutState, control: Control, now: float
) -> RolloutState:
    if control.abort_revision == state.revision and not state.aborted:
        state = replace(state, aborted=True, halted=None)
    if control.resumes > state.resumes_seen:
        state = replace(state, resumes_seen=control.resumes)
        if state.halted is not None:
            state = replace(state, halted=None, forgiven=len(state.failures))
        elif not state.aborted and isinstance(_step(strategy, state.step), Pause):
            state = _advance(state, now)
    return state


def _step(strategy: RolloutStrategy, index: int) -> Canary | Pause | None:
    return strategy.steps[index] if index < len(strategy.steps) else None


def _advance(state: RolloutState, now: float) -> RolloutState:
    return replace(state, step=state.step + 1, step_started_at=now)


# --- rolling out -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fleet:
    """The followers sorted by what the rollout may do with them."""

    total: int
    all: tuple[Follower, ...]
    movable: tuple[Follower, ...]
    own: tuple[Follower, ...]  # a move of this rollout (any revision) is queued or running
    candidates: tuple[Follower, ...]  # may start a move to ``desired`` now
    pool: int  # still to reach ``desired``, failures excluded (in flight included)
    waiting: Counter[str]


def _sort(followers: Sequence[Follower], desired: str, failed: frozenset[str]) -> _Fleet:
    # A suspended session has no owner to move: it starts on the rollout's version when
    # it resumes (``version_for_new_session``), so the rollout neither moves nor waits
    # for it.
    movable = tuple(f for f in followers if not f.pinned and not f.suspended)
    own = tuple(f for f in movable if f.move is not None and f.move.revision is not None)
    candidates: list[Follower] = []
    waiting: Counter[str] = Counter()
    pool = 0
    for follower in movable:
        if follower.version == desired or follower.name in failed:
            continue
        pool += 1
        if follower.move is not None:
            if follower.move.revision is None:
                waiting["OtherMigration"] += 1
        elif not follower.serving:
            waiting["NotServing"] += 1
        else:
            candidates.append(follower)
    return _Fleet(len(followers), tuple(followers), movable, own, tuple(candidates), pool, waiting)


def _roll_out(
    followers: Sequence[Follower],
    strategy: RolloutStrategy,
    state: RolloutState,
    control: Control,
    now: float,
) -> Plan:
    assert state.target is not None
    target = state.target
    # A move the gate could not judge is retried after a resume (once forgiven).
    failed = frozenset(
        f.session
        for f in state.failures
        if not f.aborting and f.kind is not FailureKind.NO_LIVE_TURNS
    ) | frozenset(f.session for f in state.inconclusive())
    fleet = _sort(followers, target, failed)
    stale = _stale(fleet.own, state.revision, target)

    if state.halted is None and len(state.step_failures()) > strategy.failure_budget:
        state = replace(state, halted=_halt(state, strategy, now))
    if state.halted is None and state.inconclusive():
        state = replace(state, halted=_inconclusive(state, strategy, now))
    if state.halted is not None:
        return _plan(
            followers,
            strategy,
            state,
            fleet,
            (),
            _queued(fleet.own),
            now,
            RolloutPhase.HALTED,
            state.halted.message,
        )
    if control.paused:
        paused = _plan(
            followers,
            strategy,
            state,
            fleet,
            (),
            stale,
            now,
            RolloutPhase.PAUSED,
            "paused (spec.paused): set it to false to continue",
        )
        # Nobody knows when a person will unpause it.
        return replace(paused, progress=replace(paused.progress, estimated_completion=None))

    current = _current(fleet.own, state.revision, target)
    while True:
        step = _step(strategy, state.step)
        if isinstance(step, Pause):
            started = state.step_started_at if state.step_started_at is not None else now
            if state.step_started_at is None:
                state = replace(state, step_started_at=now)
            if step.seconds is not None and now >= started + step.seconds:
                state = _advance(state, now)
                continue
            wake = started + step.seconds if step.seconds is not None else None
            message = (
                f"step {state.step}: {step.describe()}"
                + ("" if wake is None else f" (resumes by itself in {wake - now:.0f}s)")
                + "; kubectl shadowpod rollout resume continues now"
            )
            result = _plan(
                followers, strategy, state, fleet, (), stale, now, RolloutPhase.PAUSED, message
            )
            return replace(result, wake_at=wake)
        upgraded = sum(1 for f in fleet.movable if f.version == target)
        goal = len(fleet.movable) if step is None else step.goal(len(fleet.movable))
        remaining_pool = fleet.pool - len(current)
        if current or (upgraded < goal and remaining_pool > 0):
            break
        if step is None:
            unavailable = _unavailable(followers)
            if state.completed_at is None and unavailable > strategy.pace.max_unavailable:
                # As a Deployment's: complete once the moved sessions serve again, so
                # Complete never shows beside Available False (a session just moved
                # whose new owner is not Ready yet). Once complete it stays so: a later
                # outage is Available's to say.
                return _plan(
                    followers,
                    strategy,
                    state,
                    fleet,
                    (),
                    stale,
                    now,
                    RolloutPhase.PROGRESSING,
                    f"every session that may move runs {target}; waiting for {unavailable}"
                    f" session{'s' if unavailable != 1 else ''} to serve again"
                    f" (maxUnavailable {strategy.pace.max_unavailable})",
                )
            if state.completed_at is None:
                state = replace(state, completed_at=now)
            return _plan(
                followers,
                strategy,
                state,
                fleet,
                (),
                stale,
                now,
                RolloutPhase.COMPLETE,
                _complete_message(fleet, target, failed),
            )
        state = _advance(state, now)

    want = goal - upgraded - len(current)
    start, waiting = _choose(
        fleet, strategy, want, state.revision, target, lambda f: state.attempts(f.name)
    )
    message = (
        f"step {state.step}: {strategy.describe(state.step)}, {upgraded} of {goal} on {target}"
    )
    return _plan(
        followers,
        strategy,
        state,
        fleet,
        start,
        stale,
        now,
        RolloutPhase.PROGRESSING,
        message,
        waiting,
    )


def _halt(state: RolloutState, strategy: RolloutStrategy, now: float) -> Halt:
    failures = state.step_failures()
    kinds = Counter(failure.kind for failure in failures)
    reason = min(kinds, key=lambda kind: (-kinds[kind], list(kinds).index(kind)))
    breakdown = ", ".join(f"{count} {kind.value}" for kind, count in kinds.most_common())
    sessions = ", ".join(sorted(failure.session for failure in failures)[:5])
    more = "…" if len(failures) > 5 else ""
    return Halt(
        step=state.step,
        reason=reason,
        message=(
            f"{len(failures)} migrations of step {state.step} ({strategy.describe(state.step)})"
            f" did not reach {state.target} ({breakdown}), more than failureBudget"
            f" {strategy.failure_budget}: {sessions}{more}. The other sessions were left as"
            " they are; fix the version (or the gate) and resume, or abort to move the"
            " upgraded sessions back"
        ),
        at=now,
    )


def _inconclusive(state: RolloutState, strategy: RolloutStrategy, now: float) -> Halt:
    sessions = sorted({failure.session for failure in state.inconclusive()})
    shown = ", ".join(sessions[:5]) + ("…" if len(sessions) > 5 else "")
    return Halt(
        step=state.step,
        reason=FailureKind.NO_LIVE_TURNS,
        message=(
            f"step {state.step} ({strategy.describe(state.step)}): the upgrade gate saw no"
            f" live turn to judge on {shown} (no client traffic within its"
            " spec.migration.validation.timeoutSeconds), so it could not say whether"
            f" {state.target} is good: inconclusive, not rejected; those sessions stay on"
            " their version and nothing else moved. Send traffic to the sessions and run"
            " kubectl shadowpod rollout resume to judge again, or abort"
        ),
        at=now,
    )


def _complete_message(fleet: _Fleet, target: str, failed: frozenset[str]) -> str:
    message = f"every session that may move runs {target}"
    if failed:
        message += f", but {len(failed)} failed to move and stay on their version"
    pinned = any(f.pinned for f in fleet.all)
    suspended = sum(1 for f in fleet.all if f.suspended and not f.pinned)
    if suspended:
        message += f"; {suspended} suspended start on it when they resume"
    return message + (" (pinned sessions stay where they are)" if pinned else "")


# --- aborting ----------------------------------------------------------------------------


def _abort(
    followers: Sequence[Follower], strategy: RolloutStrategy, state: RolloutState, now: float
) -> Plan:
    """Every session the rollout moved goes back to the stable version, at the pace, with
    no steps and no budget: each move back is a migration with its own gates."""
    if state.stable is None:
        fleet = _sort(followers, state.target or "", frozenset(f.name for f in followers))
        return _plan(
            followers,
            strategy,
            state,
            fleet,
            (),
            _queued(fleet.own),
            now,
            RolloutPhase.ABORTED,
            "aborted: there is no earlier version to move back to; set the"
            " template's image to the version you want",
        )
    stable = state.stable
    failed = frozenset(f.session for f in state.failures if f.aborting)
    fleet = _sort(followers, stable, failed)
    stale = _stale(fleet.own, state.revision, stable)
    current = _current(fleet.own, state.revision, stable)
    if fleet.pool - len(current) <= 0 and not current:
        message = f"aborted: every session that may move is back on {stable}"
        if failed:
            message += f", but {len(failed)} could not be moved back"
        return _plan(
            followers, strategy, state, fleet, (), stale, now, RolloutPhase.ABORTED, message
        )
    start, waiting = _choose(fleet, strategy, fleet.pool, state.revision, stable)
    back = sum(1 for f in fleet.movable if f.version == stable)
    return _plan(
        followers,
        strategy,
        state,
        fleet,
        start,
        stale,
        now,
        RolloutPhase.ABORTING,
        f"aborting: {back} of {len(fleet.movable)} back on {stable}",
        waiting,
    )


# --- choosing sessions -------------------------------------------------------------------


def _current(own: Sequence[Follower], revision: int, desired: str) -> tuple[Follower, ...]:
    return tuple(
        f
        for f in own
        if f.move is not None and f.move.revision == revision and f.move.target == desired
    )


def _stale(own: Sequence[Follower], revision: int, desired: str) -> tuple[str, ...]:
    """Queued moves of an earlier revision or towards another version: withdrawn. Running
    ones finish (a move is cancelled by rolling it back, which is no quicker)."""
    return tuple(
        f.move.migration
        for f in own
        if f.move is not None
        and f.move.state is MoveState.QUEUED
        and (f.move.revision != revision or f.move.target != desired)
    )


def _queued(own: Sequence[Follower]) -> tuple[str, ...]:
    return tuple(
        f.move.migration for f in own if f.move is not None and f.move.state is MoveState.QUEUED
    )


def _choose(
    fleet: _Fleet,
    strategy: RolloutStrategy,
    want: int,
    revision: int,
    desired: str,
    attempts: Callable[[Follower], int] = lambda _: 0,
) -> tuple[tuple[Start, ...], Counter[str]]:
    """Up to ``want`` candidates within the rollout's pace, spread over nodes (the node
    with the fewest of the rollout's moves first), by name within a node."""
    pace = strategy.pace
    waiting = Counter(fleet.waiting)
    unavailable = sum(
        1 for f in fleet.movable if not f.serving and (f.version == desired or f in fleet.own)
    )
    if unavailable > pace.max_unavailable:
        waiting["Unavailable"] += len(fleet.candidates)
        return (), waiting
    per_node: Counter[str | None] = Counter(f.node for f in fleet.own)
    slots = min(want, pace.max_concurrent - len(fleet.own))
    by_node: defaultdict[str | None, list[Follower]] = defaultdict(list)
    for follower in sorted(fleet.candidates, key=lambda f: f.name):
        by_node[follower.node].append(follower)
    chosen: list[Start] = []
    while len(chosen) < slots:
        open_nodes = [
            node for node, queue in by_node.items() if queue and per_node[node] < pace.max_per_node
        ]
        if not open_nodes:
            break
        node = min(open_nodes, key=lambda n: (per_node[n], n or ""))
        follower = by_node[node].pop(0)
        per_node[node] += 1
        chosen.append(Start(follower.name, desired, follower.node, revision, attempts(follower)))
    left = len(fleet.candidates) - len(chosen)
    if left > 0:
        waiting["Paced" if want > len(chosen) else "LaterStep"] += left
    return tuple(chosen), waiting


def _plan(
    followers: Sequence[Follower],
    strategy: RolloutStrategy,
    state: RolloutState,
    fleet: _Fleet,
    start: tuple[Start, ...],
    cancel: tuple[str, ...],
    now: float,
    phase: RolloutPhase,
    message: str,
    waiting: Counter[str] | None = None,
) -> Plan:
    target = state.target or ""
    cancelled = set(cancel)
    in_flight = [f for f in fleet.own if f.move is not None and f.move.migration not in cancelled]
    remaining = 0 if phase in (RolloutPhase.COMPLETE, RolloutPhase.ABORTED) else max(0, fleet.pool)
    eta = None
    if phase in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED, RolloutPhase.COMPLETE):
        eta = estimated_completion(followers, state, strategy, remaining, now)
    counted = waiting if waiting is not None else _idle(fleet, phase)
    progress = Progress(
        phase=phase,
        step=state.step,
        steps=len(strategy.steps) + 1,
        step_description=strategy.describe(state.step),
        message=message,
        versions=version_counts(followers),
        total=len(followers),
        updated=sum(1 for f in followers if f.version == target),
        pinned=sum(1 for f in followers if f.pinned),
        queued=sum(1 for f in in_flight if f.move is not None and f.move.state is MoveState.QUEUED),
        running=sum(
            1 for f in in_flight if f.move is not None and f.move.state is MoveState.RUNNING
        ),
        failed=len({f.session for f in state.failures}),
        unavailable=_unavailable(followers),
        suspended=sum(1 for f in followers if f.suspended),
        waiting=tuple(sorted((reason, n) for reason, n in counted.items() if n)),
        gates=gate_verdicts(followers, state.revision),
        estimated_completion=eta,
    )
    return Plan(state=state, start=start, cancel=cancel, progress=progress)


def _unavailable(followers: Sequence[Follower]) -> int:
    """Sessions that should serve and do not (a suspended one is not meant to)."""
    return sum(1 for f in followers if not f.serving and not f.suspended)


def _idle(fleet: _Fleet, phase: RolloutPhase) -> Counter[str]:
    waiting = Counter(fleet.waiting)
    if fleet.candidates:
        waiting[phase.value] += len(fleet.candidates)
    return waiting
