"""A source pod killed mid-migration, through the operator: the engine (the same as on
the local runtime) sees the pod's agent container ended by SIGKILL and finishes
forward — the shadow takes the next epoch — instead of fencing a dead owner until the
migration rolls back to it. The kill lands in a known phase: the shadow pod is held in
ContainerCreating by the kubelet (Restoring), or the source is frozen in a turn that
the fence waits for (Fencing, the gateway's fence persisted)."""

from __future__ import annotations

from typing import Any, Final

import pytest

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.ownership import FenceState
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.kube import names
from shadowpod.kube.records import MigrationRecords
from tests.kube.kubelet import Kubelet
from tests.kube.kubelet.pods import PodWorker
from tests.kube.operator_world import Load, World, bump, invariants, session_manifest
from tests.kube.support import eventually

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.stand_in(
        "the kill must land in a known phase: the stand-in holds the shadow pod in "
        "ContainerCreating (kubelet.held) and kills the agent's own process (PodWorker); "
        "a real kubelet can do neither on cue"
    ),
]

# Every accepted message answered within this: the shadow pod's start (held here for
# as long as the test needs, then 1-3 s), one fence timeout (5 s) at most to see the
# source dead, the takeover, and the turns the source had not finished. Before the
# fix, they were never answered by anyone.
ANSWER_BOUND_S: Final = 30.0


async def _phase(world: World, migration: str) -> str | None:
    found = await world.migration(migration)
    return None if found is None else (found.get("status") or {}).get("phase")


def _worker(kubelet: Kubelet, world: World, pod: str) -> PodWorker:
    worker = kubelet.worker(world.namespace, pod)
    assert worker is not None, f"no pod {pod} runs"
    return worker


async def _pod_ended(world: World, pod: str) -> bool:
    found = await world.raw.get(world.path("pods", pod))
    for container in ((found or {}).get("status") or {}).get("containerStatuses", []):
        if "terminated" in (container.get("state") or {}):
            return True
    return found is None


def _answered_within_bound(load: Load) -> dict[str, Any]:
    verdict = load.load.verdict()
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0), verdict
    assert verdict.latency_ms["max"] <= ANSWER_BOUND_S * 1000, verdict.latency_ms
    return verdict.latency_ms


async def test_a_source_pod_killed_while_the_shadow_restores_is_taken_over(
    world: World, kubelet: Kubelet
) -> None:
    """And the operator is restarted meanwhile: the engine it resumes finds the source
    dead from the pod's status, as the first one would have."""
    await world.apply(session_manifest("sl1"))
    body = await world.wait_running("sl1", epoch=1)
    source = body["status"]["ownerPod"]
    gid = world.gateway_session("sl1")
    kubelet.held[names.MIGRATION_LABEL] = names.image_migration("sl1", 2)
    control = GatewayClient(world.gateway.url, world.gateway.control_token)
    async with Load(world, "sl1", rate=10) as load, control as client:
        await eventually(lambda: load.load.replies, timeout=30)
        migration_name = await bump(world, "sl1", "refagent:v2")
        assert migration_name == names.image_migration("sl1", 2)

        async def restoring() -> bool:
            return await _phase(world, migration_name) == "Restoring"

        await eventually(restoring, timeout=60)
        # Killed mid-turn: it holds a message it will never ack.
        long_turn = await client.post_message(gid, "sleep 1", id="long-turn")

        async def released() -> bool:
            return (await client.status(gid)).delivered_through >= long_turn.seq

        await eventually(released, timeout=30, every=0.01)
        _worker(kubelet, world, source).crash(names.AGENT_CONTAINER)
        await eventually(lambda: _pod_ended(world, source), timeout=30)
        await world.stop_operator()
        await world.start_operator()
        assert await _phase(world, migration_name) == "Restoring"  # held there all along
        del kubelet.held[names.MIGRATION_LABEL]
        migration = await world.wait_finished(migration_name)
        body = await world.wait_settled("sl1", epoch=2)
        assert await load.stop()
        broken = invariants(load, [migration])
        _answered_within_bound(load)
    assert broken == {}
    status = migration["status"]
    assert status["result"] == "Succeeded", status.get("message")
    record = World.record(migration)
    assert record.source_lost is not None and record.source_lost.phase is Phase.FENCING
    assert "code 137" in record.source_lost.how, record.source_lost
    assert record.fence is not None and record.fence.waited_ms == 0.0  # no fence: a bump
    assert body["status"]["ownerPod"] == status["target"]["pod"]
    assert body["status"]["image"] == "refagent:v2"


async def test_a_source_pod_killed_while_the_fence_waits_for_its_turn_is_taken_over(
    world: World, kubelet: Kubelet
) -> None:
    """The source is frozen (SIGSTOP) in a turn while the shadow restores: the fence
    finds that turn unfinished and waits; seen waiting (the gateway's fence persisted),
    the source is killed. After that one fence timeout the engine finds it dead and
    bumps the epoch to the shadow, which answers the turn once."""
    await world.apply(session_manifest("sl2"))
    body = await world.wait_running("sl2", epoch=1)
    source = body["status"]["ownerPod"]
    gid = world.gateway_session("sl2")
    kubelet.held[names.MIGRATION_LABEL] = names.image_migration("sl2", 2)
    control = GatewayClient(world.gateway.url, world.gateway.control_token)
    async with Load(world, "sl2", rate=10) as load, control as client:
        await eventually(lambda: load.load.replies, timeout=30)
        migration_name = await bump(world, "sl2", "refagent:v2")

        async def restoring() -> bool:
            return await _phase(world, migration_name) == "Restoring"

        await eventually(restoring, timeout=60)
        long_turn = await client.post_message(gid, "sleep 1", id="long-turn")

        async def released() -> bool:
            return (await client.status(gid)).delivered_through >= long_turn.seq

        await eventually(released, timeout=30, every=0.01)
        _worker(kubelet, world, source).freeze(names.AGENT_CONTAINER)  # mid-turn, for good
        del kubelet.held[names.MIGRATION_LABEL]

        async def fenced() -> bool:
            return (await client.ownership(gid)).fence is FenceState.FENCED

        await eventually(fenced, timeout=60, every=0.01)
        _worker(kubelet, world, source).crash(names.AGENT_CONTAINER)
        migration = await world.wait_finished(migration_name)
        await world.wait_settled("sl2", epoch=2)
        assert await load.stop()
        broken = invariants(load, [migration])
        _answered_within_bound(load)
        replies = list(load.load.replies.get(long_turn.seq, []))
    assert broken == {}
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")
    record = World.record(migration)
    assert record.source_lost is not None and record.source_lost.phase is Phase.FENCING
    assert record.fence_attempts == 1, record.notes  # one timeout, then the takeover
    assert len(replies) == 1 and replies[0].version == "2", replies  # answered once, by v2


BEFORE_THE_BUMP: Final = ["Preflight", "Snapshotting", "Restoring", "CatchingUp", "Fencing"]


@pytest.mark.parametrize("phase", BEFORE_THE_BUMP)
async def test_a_source_pod_killed_mid_turn_at_any_phase_before_the_bump_is_taken_over(
    world: World, kubelet: Kubelet, phase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after the operator saved ``phase`` (the engine held there), a long turn is
    given to the source and its agent is killed (exit 137) in it: the migration
    finishes forward to v2, nothing lost, the turn answered once, by v2."""
    await world.apply(session_manifest("sl3"))
    body = await world.wait_running("sl3", epoch=1)
    source = body["status"]["ownerPod"]
    gid = world.gateway_session("sl3")
    save = MigrationRecords.save
    long_turns: list[int] = []

    async def kills_source_after(self: MigrationRecords, record: MigrationRecord) -> None:
        await save(self, record)  # in the operator's thread, its engine held here
        if record.phase != phase or long_turns:
            return
        async with GatewayClient(world.gateway.url, world.gateway.control_token) as client:
            accepted = await client.post_message(gid, "sleep 1", id="long-turn")
            long_turns.append(accepted.seq)

            async def released() -> bool:
                return (await client.status(gid)).delivered_through >= accepted.seq

            await eventually(released, timeout=30, every=0.01)
        _worker(kubelet, world, source).crash(names.AGENT_CONTAINER)

    async with Load(world, "sl3", rate=10) as load:
        await eventually(lambda: load.load.replies, timeout=30)
        monkeypatch.setattr(MigrationRecords, "save", kills_source_after)
        migration_name = await bump(world, "sl3", "refagent:v2")
        migration = await world.wait_finished(migration_name)
        monkeypatch.setattr(MigrationRecords, "save", save)
        body = await world.wait_settled("sl3", epoch=2)
        assert await load.stop()
        broken = invariants(load, [migration])
        _answered_within_bound(load)
        [seq] = long_turns
        replies = list(load.load.replies.get(seq, []))
    assert broken == {}
    status = migration["status"]
    assert status["result"] == "Succeeded", status.get("message")
    record = World.record(migration)
    assert record.source_lost is not None and "code 137" in record.source_lost.how
    assert body["status"]["ownerPod"] == status["target"]["pod"]
    assert len(replies) == 1 and replies[0].version == "2", replies
