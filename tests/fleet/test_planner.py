"""The rollout planner, driven as the operator will drive it: step by step over a fleet."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadowpod.fleet.followers import FailureKind, Follower, Outcome
from shadowpod.fleet.pacing import Caps
from shadowpod.fleet.planner import plan, version_for_new_session
from shadowpod.fleet.progress import RolloutPhase, conditions
from shadowpod.fleet.state import Control, RolloutState
from shadowpod.fleet.strategy import Canary, Pace, Pause, RolloutStrategy
from tests.fleet.world import World, fleet

OLD, NEW = "agent:1", "agent:2"
CANARY_THEN_PAUSE = RolloutStrategy(
    steps=(Canary(sessions=2), Pause(), Canary(percent=50)),
    pace=Pace(max_concurrent=4, max_per_node=2),
)


def rejected(_session: str, target: str) -> tuple[bool, str | None]:
    return (target != NEW, None if target != NEW else "ValidationFailed")


def test_a_canary_step_moves_its_sessions_then_waits_for_a_resume() -> None:
    world = World(fleet(20), CANARY_THEN_PAUSE)
    first = world.tick(NEW)
    assert first.progress.phase is RolloutPhase.PROGRESSING
    assert [s.session for s in first.start] == ["s0000", "s0001"]  # two nodes, one each
    assert {s.node for s in first.start} == {"node-0", "node-1"}
    for _ in range(5):
        world.tick(NEW)
    paused = world.plans[-1]
    assert paused.progress.phase is RolloutPhase.PAUSED
    assert paused.progress.step == 1
    assert "pause until resumed" in paused.progress.message
    assert dict(paused.progress.versions) == {NEW: 2, OLD: 18}
    for _ in range(5):  # nobody resumes: nothing moves
        assert world.tick(NEW).start == ()
    world.control = Control(resumes=1)
    resumed = world.tick(NEW)
    assert resumed.progress.step == 2
    assert len(resumed.start) == 4  # the pace, toward 10 of 20
    done = world.run(NEW, 200, lambda p: p.progress.phase is RolloutPhase.COMPLETE)
    assert dict(done.progress.versions) == {NEW: 20}
    assert done.state.completed_at is not None
    assert done.progress.estimated_completion == world.now  # nothing left: now


def test_a_timed_pause_ends_by_itself_and_says_when() -> None:
    strategy = RolloutStrategy(steps=(Canary(sessions=1), Pause(seconds=30)))
    world = World(fleet(4), strategy)
    world.run(NEW, 10, lambda p: p.progress.phase is RolloutPhase.PAUSED)
    paused = world.plans[-1]
    assert paused.wake_at is not None and paused.wake_at > world.now
    assert "resumes by itself in" in paused.progress.message
    done = world.run(NEW, 60, lambda p: p.progress.phase is RolloutPhase.COMPLETE)
    assert dict(done.progress.versions) == {NEW: 4}


def test_a_rejected_canary_halts_with_the_reason_and_leaves_the_rest() -> None:
    strategy = RolloutStrategy(steps=(Canary(sessions=3), Pause()), failure_budget=1)
    world = World(fleet(30), strategy, judge=rejected)
    halted = world.run(NEW, 30, lambda p: p.progress.phase is RolloutPhase.HALTED)
    assert halted.state.halted is not None
    assert halted.state.halted.reason is FailureKind.GATE_REJECTED
    assert "more than failureBudget 1" in halted.state.halted.message
    assert len(world.started) == 3  # the canary, nobody else
    assert all(f.version == OLD for f in world.sessions.values())
    condition = {c.type: c for c in conditions(halted.progress, halted.state, 0)}
    assert (condition["Halted"].status, condition["Halted"].reason) == ("True", "GateRejected")
    assert condition["Progressing"].status == "False"
    assert halted.progress.gates.rejected == 3
    for _ in range(10):
        assert world.tick(NEW).start == ()
    # A resume forgives the step's failures; the failed sessions are not retried.
    world.control = Control(resumes=1)
    assert world.tick(NEW).progress.phase is RolloutPhase.PROGRESSING


def test_abort_moves_the_upgraded_sessions_back() -> None:
    world = World(fleet(12), CANARY_THEN_PAUSE)
    world.run(NEW, 20, lambda p: p.progress.phase is RolloutPhase.PAUSED)
    assert sum(f.version == NEW for f in world.sessions.values()) == 2
    world.control = Control(abort_revision=world.state.revision)
    aborting = world.tick(NEW)
    assert aborting.progress.phase is RolloutPhase.ABORTING
    assert {s.target for s in aborting.start} == {OLD}
    done = world.run(NEW, 30, lambda p: p.progress.phase is RolloutPhase.ABORTED)
    assert dict(done.progress.versions) == {OLD: 12}
    # An abort of the previous revision does not abort the next bump.
    following = world.tick("agent:3")
    assert following.state.revision == world.state.revision
    assert following.progress.phase is RolloutPhase.PROGRESSING
    assert following.state.stable == OLD


def test_sessions_created_during_the_canary_start_on_the_stable_version() -> None:
    world = World(fleet(6), CANARY_THEN_PAUSE)
    world.tick(NEW)
    assert version_for_new_session(world.state, CANARY_THEN_PAUSE) == OLD
    world.run(NEW, 20, lambda p: p.progress.phase is RolloutPhase.PAUSED)
    assert version_for_new_session(world.state, CANARY_THEN_PAUSE) == OLD
    world.control = Control(resumes=1)
    world.run(NEW, 60, lambda p: p.progress.phase is RolloutPhase.COMPLETE)
    assert version_for_new_session(world.state, CANARY_THEN_PAUSE) == NEW
    assert version_for_new_session(RolloutState(), CANARY_THEN_PAUSE) is None


def test_a_second_bump_mid_rollout_keeps_the_proven_version_stable() -> None:
    world = World(fleet(10), CANARY_THEN_PAUSE)
    world.run(NEW, 20, lambda p: p.progress.phase is RolloutPhase.PAUSED)
    bumped = world.tick("agent:3")
    assert bumped.state.stable == OLD
    assert bumped.state.revision == 2
    assert bumped.state.step == 0


def test_a_bump_back_to_the_stable_version_mid_rollout_skips_the_steps() -> None:
    world = World(fleet(10), CANARY_THEN_PAUSE)
    world.run(NEW, 20, lambda p: p.progress.phase is RolloutPhase.PAUSED)
    back = world.tick(OLD)
    assert back.state.step == CANARY_THEN_PAUSE.final_step
    assert [s.target for s in back.start] == [OLD, OLD]
    done = world.run(OLD, 20, lambda p: p.progress.phase is RolloutPhase.COMPLETE)
    assert dict(done.progress.versions) == {OLD: 10}


def test_a_new_bump_withdraws_the_queued_moves_of_the_last_one() -> None:
    world = World(fleet(10), CANARY_THEN_PAUSE, caps=Caps(max_concurrent=1, max_per_node=1))
    world.tick(NEW)
    queued = [m.name for m in world.migrations.values() if not m.running]
    assert len(queued) == 1
    busy = {m.session for m in world.migrations.values()}
    bumped = world.tick("agent:3")
    assert list(bumped.cancel) == queued
    assert {s.target for s in bumped.start} == {"agent:3"}
    assert not {s.session for s in bumped.start} & busy
    done = world.run("agent:3", 100, lambda p: p.progress.phase is RolloutPhase.PAUSED)
    assert dict(done.progress.versions)["agent:3"] == 2


def test_the_plan_is_the_same_when_asked_twice() -> None:
    """A restarted operator decides again from the stored state: the same moves."""
    followers = list(fleet(40).values())
    first = plan(NEW, followers, CANARY_THEN_PAUSE, RolloutState(), Control(), 5.0)
    again = plan(NEW, followers, CANARY_THEN_PAUSE, first.state, Control(), 6.0)
    assert [s.session for s in again.start] == [s.session for s in first.start]
    assert again.state.revision == first.state.revision


def test_a_session_without_a_serving_owner_stops_the_rollout() -> None:
    sessions = fleet(10)
    sessions["s0000"] = replace(sessions["s0000"], version=NEW, serving=False)
    world = World(sessions, RolloutStrategy())
    stalled = world.tick(NEW)
    assert stalled.start == ()
    assert dict(stalled.progress.waiting)["Unavailable"] == 9
    condition = {c.type: c for c in conditions(stalled.progress, stalled.state, 0)}
    assert condition["Available"].status == "False"


def test_a_rollout_is_complete_only_once_its_sessions_serve_again() -> None:
    """As a Deployment's: every session on the new version is not enough while one of
    them has no serving owner yet (just moved, its owner not Ready): the rollout says
    Complete only when Available is True too, never Complete and unavailable at once."""
    sessions = {name: replace(follower, version=NEW) for name, follower in fleet(4).items()}
    sessions["s0003"] = replace(sessions["s0003"], serving=False)
    state = RolloutState(revision=1, target=NEW, stable=OLD, started_at=1.0)
    moved = plan(NEW, list(sessions.values()), RolloutStrategy(), state, Control(), 5.0)
    assert moved.progress.phase is RolloutPhase.PROGRESSING
    assert moved.state.completed_at is None
    assert "s0003" not in [s.session for s in moved.start]  # on NEW already: not moved
    assert "1 session" in moved.progress.message and "serv" in moved.progress.message
    condition = {c.type: c for c in conditions(moved.progress, moved.state, 0)}
    assert condition["Available"].status == "False"
    assert condition["Progressing"].reason == "RollingOut"

    sessions["s0003"] = replace(sessions["s0003"], serving=True)
    done = plan(NEW, list(sessions.values()), RolloutStrategy(), moved.state, Control(), 6.0)
    assert done.progress.phase is RolloutPhase.COMPLETE
    condition = {c.type: c for c in conditions(done.progress, done.state, 0)}
    assert (condition["Available"].status, condition["Progressing"].reason) == (
        "True",
        "RolloutComplete",
    )


def test_a_first_rollout_with_nothing_to_replace_skips_the_steps() -> None:
    """A new AgentDeployment whose sessions start on its image has no earlier version to
    guard: its canary and pause steps have nothing to compare, so it does not stop at
    the pause (the abort test waited 240 s for a Complete that a pause held back)."""
    sessions = [Follower(name, NEW, node="node-0") for name in ("a1", "a2")]
    first = plan(NEW, [], CANARY_THEN_PAUSE, RolloutState(), Control(), 1.0)
    assert first.state.stable is None
    assert first.progress.phase is RolloutPhase.COMPLETE  # no session yet: nothing to do
    later = plan(NEW, sessions, CANARY_THEN_PAUSE, first.state, Control(), 2.0)
    assert later.progress.phase is RolloutPhase.COMPLETE
    assert later.start == ()
    # Sessions already there on another version: the steps guard the move, as before.
    mixed = [Follower(name, OLD, node="node-0") for name in ("b1", "b2", "b3")]
    guarded = plan(NEW, mixed, CANARY_THEN_PAUSE, RolloutState(), Control(), 1.0)
    assert guarded.state.stable == OLD and guarded.progress.phase is RolloutPhase.PROGRESSING


def test_estimated_completion_follows_the_moves_seen() -> None:
    world = World(fleet(40), RolloutStrategy(pace=Pace(max_concurrent=4, max_per_node=2)))
    assert world.tick(NEW).progress.estimated_completion is None  # nothing to go by yet
    for _ in range(3):
        world.tick(NEW)
    eta = world.plans[-1].progress.estimated_completion
    assert eta is not None
    # 40 sessions, 4 at a time, 2 s each: about 20 s from the start.
    assert world.now < eta <= world.plans[0].state.started_at + 30  # type: ignore[operator]


# --- properties --------------------------------------------------------------------------

steps = st.lists(
    st.one_of(
        st.builds(Canary, sessions=st.integers(1, 40)),
        st.builds(Pause, seconds=st.integers(1, 5)),
    ),
    max_size=4,
).map(lambda s: tuple(sorted_canaries(s)))


def sorted_canaries(items: list[Canary | Pause]) -> list[Canary | Pause]:
    sizes = iter(sorted(i.sessions for i in items if isinstance(i, Canary) and i.sessions))
    return [Canary(sessions=next(sizes)) if isinstance(i, Canary) else i for i in items]


paces = st.builds(
    lambda total, node: Pace(max_concurrent=total, max_per_node=min(node, total)),
    st.integers(1, 8),
    st.integers(1, 4),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(1, 40),
    nodes=st.integers(1, 5),
    pinned=st.sets(st.integers(0, 39), max_size=5),
    steps=steps,
    pace=paces,
    caps=st.tuples(st.integers(1, 10), st.integers(1, 3)),
)
def test_a_good_version_reaches_every_session_within_the_caps(
    size: int,
    nodes: int,
    pinned: set[int],
    steps: tuple[Canary | Pause, ...],
    pace: Pace,
    caps: tuple[int, int],
) -> None:
    cluster = Caps(max_concurrent=caps[0], max_per_node=min(caps[1], caps[0]))
    world = World(
        fleet(size, nodes=nodes, pinned=frozenset(pinned)),
        RolloutStrategy(steps=steps, pace=pace),
        caps=cluster,
    )
    before = {name: f.version for name, f in world.sessions.items()}
    done = world.run(NEW, 2000, lambda p: p.progress.phase is RolloutPhase.COMPLETE)
    for name, follower in world.sessions.items():
        assert follower.version == (before[name] if follower.pinned else NEW), name
    assert world.max_running <= cluster.max_concurrent
    assert world.max_running_per_node <= cluster.max_per_node
    assert world.max_rollout_in_flight <= pace.max_concurrent
    assert world.max_rollout_per_node <= pace.max_per_node
    assert len(world.started) == len(set(world.started))  # each moved once
    assert done.progress.failed == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(5, 40),
    budget=st.integers(0, 3),
    pace=paces,
    canary=st.integers(1, 10),
    reason=st.sampled_from(["ValidationFailed", "IncompatibleStateSchema", "PhaseTimeout"]),
)
def test_a_bad_version_halts_after_its_budget_with_the_rest_untouched(
    size: int, budget: int, pace: Pace, canary: int, reason: str
) -> None:
    world = World(
        fleet(size),
        RolloutStrategy(steps=(Canary(sessions=canary), Pause()), pace=pace, failure_budget=budget),
        judge=lambda _s, target: (target != NEW, reason),
    )
    halted_at = None
    for tick in range(300):
        decided = world.tick(NEW)
        if decided.progress.phase is RolloutPhase.HALTED and halted_at is None:
            halted_at = tick
        if halted_at is not None:
            assert decided.start == ()  # nothing new once halted
    attempted = len(world.started)
    failed = len(world.state.failures)
    if failed > budget:
        assert halted_at is not None
        assert world.state.halted is not None
        assert (
            world.state.halted.reason.value
            == {
                "ValidationFailed": "GateRejected",
                "IncompatibleStateSchema": "SchemaIncompatible",
                "PhaseTimeout": "TimedOut",
            }[reason]
        )
        # At most the budget, the one too many, and what was already in flight with it.
        assert attempted <= budget + pace.max_concurrent
    else:
        # The canary was smaller than the budget: it ends, and the pause holds the rest.
        assert attempted == min(canary, size)
        assert world.plans[-1].progress.phase is RolloutPhase.PAUSED
    assert all(f.version == "agent:1" for f in world.sessions.values())
    assert not world.migrations


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(2, 30),
    pinned=st.sets(st.integers(0, 29), max_size=4),
    canary=st.integers(1, 30),
)
def test_abort_returns_every_moved_session_and_never_a_pinned_one(
    size: int, pinned: set[int], canary: int
) -> None:
    world = World(
        fleet(size, pinned=frozenset(pinned)),
        RolloutStrategy(steps=(Canary(sessions=canary), Pause())),
    )
    world.run(NEW, 300, lambda p: p.progress.phase in (RolloutPhase.PAUSED, RolloutPhase.COMPLETE))
    world.control = Control(abort_revision=world.state.revision)
    world.run(NEW, 300, lambda p: p.progress.phase is RolloutPhase.ABORTED)
    assert all(f.version == OLD for f in world.sessions.values())
    moved = set(world.started)
    assert not moved & {f"s{i:04}" for i in pinned}


def test_an_outcome_is_counted_once_however_often_it_is_read() -> None:
    follower = Follower(
        "s1", OLD, node="n", last=Outcome("m1", NEW, False, 1.0, 1.0, 1, "PhaseTimeout")
    )
    state = RolloutState(revision=1, target=NEW, stable=OLD, started_at=0, step_started_at=0)
    strategy = RolloutStrategy(failure_budget=5)
    first = plan(NEW, [follower], strategy, state, Control(), 2.0)
    second = plan(NEW, [follower], strategy, first.state, Control(), 3.0)
    assert len(second.state.failures) == 1


def test_a_suspended_session_neither_holds_the_rollout_nor_counts_as_unavailable() -> None:
    """A session suspended on purpose has no owner to move and is not an outage: the
    rollout completes without it (it starts on the new version when it resumes), and
    Available stays True. Before, it held the rollout Progressing, "waiting for 1
    session to serve again", for as long as it stayed suspended."""
    sessions = fleet(4)
    sessions["s0003"] = replace(sessions["s0003"], serving=False, suspended=True)
    world = World(sessions, RolloutStrategy(steps=(Canary(sessions=1),)))
    done = world.run(NEW, 40, lambda p: p.progress.phase is RolloutPhase.COMPLETE)
    assert "s0003" not in world.started
    assert done.progress.unavailable == 0 and done.progress.suspended == 1
    assert "1 suspended start on it when they resume" in done.progress.message
    condition = {c.type: c for c in conditions(done.progress, done.state, 0)}
    assert condition["Available"].status == "True"
    assert "3 of 4 sessions serving, 1 suspended" in condition["Available"].message


def test_a_canary_the_gate_saw_no_turns_of_halts_as_inconclusive_and_a_resume_retries() -> None:
    """No client traffic during the canary: the gate compared 0 live turns, so the move
    rolled back — but nothing was judged. That is not a rejection of the version: the
    rollout halts at once with NoLiveTurns (whatever the budget), counts it against no
    budget, says how to go on, and a resume moves the same session again. Before, it
    was counted as GateRejected and the session was never retried."""
    strategy = RolloutStrategy(steps=(Canary(sessions=1), Pause()), failure_budget=5)
    world = World(fleet(6), strategy, judge=lambda _s, _t: (False, "ValidationFailed"))
    world.traffic = False
    halted = world.run(NEW, 30, lambda p: p.progress.phase is RolloutPhase.HALTED)
    assert halted.state.halted is not None
    assert halted.state.halted.reason is FailureKind.NO_LIVE_TURNS
    assert "no live turn to judge on s0000" in halted.state.halted.message
    assert "inconclusive, not rejected" in halted.state.halted.message
    assert "rollout resume" in halted.state.halted.message
    assert world.started == ["s0000"]
    condition = {c.type: c for c in conditions(halted.progress, halted.state, 0)}
    assert (condition["Halted"].status, condition["Halted"].reason) == ("True", "NoLiveTurns")
    for _ in range(5):
        assert world.tick(NEW).start == ()

    # Clients talk now; a resume judges the canary again, under a new migration name.
    world.traffic, world.judge = True, lambda _s, _t: (True, None)
    world.control = Control(resumes=1)
    retried = world.tick(NEW)
    assert [(s.session, s.attempt) for s in retried.start] == [("s0000", 1)]
    paused = world.run(NEW, 20, lambda p: p.progress.phase is RolloutPhase.PAUSED)
    assert paused.state.halted is None
    assert world.sessions["s0000"].version == NEW
    assert world.started == ["s0000", "s0000"]


def test_a_rejection_with_turns_compared_is_still_a_rejection() -> None:
    strategy = RolloutStrategy(steps=(Canary(sessions=1), Pause()), failure_budget=0)
    world = World(fleet(6), strategy, judge=rejected)
    halted = world.run(NEW, 30, lambda p: p.progress.phase is RolloutPhase.HALTED)
    assert halted.state.halted is not None
    assert halted.state.halted.reason is FailureKind.GATE_REJECTED
