"""The cluster-wide pacing queue: caps, order within a group, fairness between groups."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowpod.fleet.followers import Follower
from shadowpod.fleet.pacing import Caps, Request, admit, drain_group, rollout_group
from shadowpod.fleet.progress import RolloutPhase
from shadowpod.fleet.strategy import RolloutStrategy, StrategyError
from tests.fleet.world import World, fleet

NODES = ["n1", "n2", "n3", None]
GROUPS = [
    rollout_group("a", "support"),
    rollout_group("b", "sales"),
    drain_group("n1"),
    "session/a/one",
]

requests = st.lists(
    st.builds(
        Request,
        name=st.uuids().map(str),
        group=st.sampled_from(GROUPS),
        node=st.sampled_from(NODES),
        queued_at=st.integers(0, 50).map(float),
        running=st.booleans(),
    ),
    max_size=60,
    unique_by=lambda r: r.name,
)
caps = st.builds(
    lambda total, node: Caps(max_concurrent=total, max_per_node=min(node, total)),
    st.integers(1, 12),
    st.integers(1, 4),
)


def test_bad_caps_say_which_flag() -> None:
    with pytest.raises(StrategyError, match="--max-concurrent-migrations is 0"):
        Caps(max_concurrent=0)
    with pytest.raises(StrategyError, match="--max-concurrent-migrations-per-node is 5: give 1"):
        Caps(max_concurrent=4, max_per_node=5)


def test_defaults() -> None:
    assert Caps() == Caps(max_concurrent=10, max_per_node=2)


@settings(max_examples=300, deadline=None)
@given(requests=requests, caps=caps)
def test_admission_never_exceeds_the_caps(requests: list[Request], caps: Caps) -> None:
    admitted = set(admit(requests, caps).admit)
    running = [r for r in requests if r.running or r.name in admitted]
    already = [r for r in requests if r.running]
    # Caps lowered under what already runs: nothing more starts, nothing is stopped.
    assert len(running) <= max(caps.max_concurrent, len(already))
    if admitted:
        assert len(running) <= caps.max_concurrent
    nodes = Counter(r.node for r in running if r.node is not None)
    before = Counter(r.node for r in already if r.node is not None)
    for node, count in nodes.items():
        assert count <= max(caps.max_per_node, before[node])
        if count > before[node]:
            assert count <= caps.max_per_node


@settings(max_examples=300, deadline=None)
@given(requests=requests, caps=caps)
def test_admission_is_work_conserving_and_the_queue_complete(
    requests: list[Request], caps: Caps
) -> None:
    """A slot stays free only when no waiting request fits; every waiting request shows."""
    result = admit(requests, caps)
    admitted = set(result.admit)
    waiting = [r for r in requests if not r.running and r.name not in admitted]
    assert sorted(result.queue) == sorted(r.name for r in waiting)
    running = [r for r in requests if r.running or r.name in admitted]
    if len(running) < caps.max_concurrent:
        nodes = Counter(r.node for r in running)
        for request in waiting:
            assert request.node is not None and nodes[request.node] >= caps.max_per_node


@settings(max_examples=300, deadline=None)
@given(requests=requests, caps=caps)
def test_the_fewest_running_group_goes_first(requests: list[Request], caps: Caps) -> None:
    """Max-min fairness: no group got a slot while a group with fewer running had a
    request that fitted; a drain is never starved by a rollout however many it queued."""
    result = admit(requests, caps)
    admitted = set(result.admit)
    running = [r for r in requests if r.running or r.name in admitted]
    groups = Counter(r.group for r in running)
    nodes = Counter(r.node for r in running)
    fitting_waiters = {
        r.group
        for r in requests
        if not r.running
        and r.name not in admitted
        and (r.node is None or nodes[r.node] < caps.max_per_node)
    }
    for group in {r.group for r in requests if r.name in admitted}:
        for waiter in fitting_waiters:
            assert groups[group] - 1 <= groups[waiter], (group, waiter)


@settings(max_examples=200, deadline=None)
@given(requests=requests, caps=caps)
def test_within_a_group_requests_on_one_node_run_in_order(
    requests: list[Request], caps: Caps
) -> None:
    admitted = set(admit(requests, caps).admit)
    waiting = [r for r in requests if not r.running]
    for request in waiting:
        if request.name in admitted:
            continue
        for other in waiting:
            if (other.group, other.node) == (request.group, request.node) and (
                other.queued_at,
                other.name,
            ) > (request.queued_at, request.name):
                assert other.name not in admitted, f"{other.name} overtook {request.name}"


@settings(max_examples=30, deadline=None)
@given(size=st.integers(40, 80), drained=st.integers(1, 6))
def test_a_drain_finishes_while_a_large_rollout_runs(size: int, drained: int) -> None:
    """A rollout of many sessions and a drain of a few share the slots: the drain's moves
    all finish at the pace of its own node's cap, however much the rollout queued."""
    world = World(
        fleet(size, nodes=4), RolloutStrategy(), caps=Caps(max_concurrent=4, max_per_node=2)
    )
    world.tick("agent:2")
    for index in range(drained):
        world.sessions[f"d{index}"] = Follower(f"d{index}", "agent:2", node="node-9")
    drain = set(world.drain("node-9"))
    assert len(drain) == drained
    ticks = 0
    while drain & set(world.migrations):
        world.tick("agent:2")
        ticks += 1
    # Two at a time out of node-9 (its cap), each two ticks long, plus a tick to start.
    assert ticks <= (drained + 1) // 2 * world.duration + 1
    assert world.plans[-1].progress.phase is RolloutPhase.PROGRESSING


@settings(max_examples=200, deadline=None)
@given(requests=requests, slots=st.integers(1, 12))
def test_a_queued_migrations_position_is_its_turn(requests: list[Request], slots: int) -> None:
    """Without node caps in the way, the queue shown is the order in which the free
    slots would go: admitting ``slots`` then the queue is admitting all at once."""
    anywhere = [replace(r, node=None) for r in requests]
    few = admit(
        anywhere, Caps(max_concurrent=slots + sum(r.running for r in anywhere), max_per_node=1)
    )
    everything = admit(anywhere, Caps(max_concurrent=10_000, max_per_node=1))
    assert few.admit + few.queue == everything.admit
