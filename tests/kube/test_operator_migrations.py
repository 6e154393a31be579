"""Migrations under the operator: an image bump live under client load (the demo's
invariants checked on the client's side), a move on demand, a cancel, a target that
fails, an incompatible state schema, an operator restarted mid-migration, a drain."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.kube import names
from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.kube.records import MigrationRecords, stored_record
from tests.kube.emulator import ApiServerEmulator
from tests.kube.kubelet import Kubelet
from tests.kube.nodes import cordon, drain
from tests.kube.operator_world import (
    Load,
    World,
    bump,
    invariants,
    reply_counts,
    session_manifest,
)
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(300)


def manual_migration(name: str, session: str, **target: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentMigration",
        "metadata": {"name": name},
        "spec": {"sessionRef": {"name": session}, "target": target},
    }


async def test_an_image_bump_migrates_live_under_load_with_nothing_lost_or_doubled(
    world: World,
) -> None:
    await world.apply(session_manifest("m1"))
    body = await world.wait_running("m1", epoch=1)
    source = body["status"]["ownerPod"]
    async with Load(world, "m1", rate=20) as load:
        await eventually(lambda: load.load.replies, timeout=30)
        migration_name = await bump(world, "m1", "refagent:v2")
        migration = await world.wait_finished(migration_name)
        body = await world.wait_settled("m1", epoch=2)
        assert await load.stop(), "some accepted messages were never answered"
        broken = invariants(load, [migration])
    assert broken == {}

    status = migration["status"]
    assert status["result"] == "Succeeded", status.get("message")
    phases = [p["phase"] for p in status["phases"]]
    assert phases[:3] == ["Pending", "Preflight", "Snapshotting"]
    assert {"Restoring", "CatchingUp", "Fencing", "Committed", "Draining"} <= set(phases)
    assert all(p["durationMilliseconds"] is not None for p in status["phases"][:-1])
    assert status["fence"]["epoch"] == 2
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    assert conds == {"Succeeded": "True", "Failed": "False"}

    # The session runs v2 in the new pod, which is now the owner; the old pod is gone.
    assert body["status"]["image"] == "refagent:v2"
    target = body["status"]["ownerPod"]
    assert target != source and target == status["target"]["pod"]
    assert body["status"]["lastMigration"]["result"] == "Succeeded"
    pods = {p["metadata"]["name"]: p for p in await world.pods("m1")}
    await eventually(lambda: _gone(world, source), timeout=30)
    assert pods[target]["metadata"]["labels"][names.ROLE_LABEL] == names.OWNER_ROLE
    reasons = [r for t, r, _ in await world.events("m1") if t == "Normal"]
    assert "MigrationFencing" in reasons and "MigrationSucceeded" in reasons
    assert (
        world.metrics.migrations.labels(result="Succeeded", reason="ImageChange")._value.get() == 1
    )


async def test_a_migration_created_by_hand_moves_the_session_to_the_named_node(
    world: World,
) -> None:
    await world.nodes.add_node("node-2")
    await world.apply(session_manifest("m2"))
    body = await world.wait_running("m2", epoch=1)
    here = body["status"]["nodeName"]
    there = "node-2" if here == "node-1" else "node-1"
    await world.apply(manual_migration("move-m2", "m2", nodeName=there))
    migration = await world.wait_finished("move-m2")
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")
    body = await world.wait_running("m2", epoch=2)
    assert body["status"]["nodeName"] == there
    assert body["status"]["image"] == "refagent:v1"  # same image, another node


async def test_a_move_by_hand_to_another_image_is_kept_until_spec_image_changes(
    world: World,
) -> None:
    """A user's AgentMigration to another image is honoured: the session stays on it
    (before, the operator moved it straight back to ``spec.image`` — to an image that
    cannot read what v2 wrote); a later change of ``spec.image`` moves it again."""
    await world.apply(session_manifest("m9"))
    await world.wait_running("m9", epoch=1)
    await world.apply(manual_migration("hand-m9", "m9", image="refagent:v2"))
    migration = await world.wait_finished("hand-m9")
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")
    body = await world.wait_settled("m9", epoch=2)
    assert body["status"]["image"] == "refagent:v2"
    await asyncio.sleep(5.0)  # ten reconcile intervals
    made = await world.raw.list(world.path("agentmigrations"), labels={names.SESSION_LABEL: "m9"})
    assert [m["metadata"]["name"] for m in made] == ["hand-m9"]
    body = await world.session("m9")
    assert (body["status"]["epoch"], body["status"]["image"]) == (2, "refagent:v2")

    migration_name = await bump(world, "m9", "refagent:v2-reworded")
    migration = await world.wait_finished(migration_name)
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")
    body = await world.wait_settled("m9", epoch=3)
    assert body["status"]["image"] == "refagent:v2-reworded"


@pytest.mark.parametrize(
    ("target", "reason", "says"),
    [
        ({"image": "refagent:no-such-tag"}, "ImagePullFailed", "cannot be pulled"),
        ({"nodeName": "no-such-node"}, "NodeNotFound", "does not exist"),
    ],
    ids=["image", "node"],
)
async def test_a_target_that_can_never_run_fails_at_once_saying_why(
    world: World, target: dict[str, str], reason: str, says: str
) -> None:
    """An image no registry has, or a node that does not exist: the migration fails
    with that reason (the condition, a Warning event on it and its session) and rolls
    back, well before its phase would time out (60 s) — not as "the shadow reporting
    ready did not happen"."""
    await world.apply(
        session_manifest("m10", migration={"phaseTimeoutSeconds": 60, "maxDurationSeconds": 120})
    )
    body = await world.wait_running("m10", epoch=1)
    source = body["status"]["ownerPod"]
    started = asyncio.get_running_loop().time()
    await world.apply(manual_migration("never-m10", "m10", **target))
    migration = await world.wait_finished("never-m10")
    assert asyncio.get_running_loop().time() - started < 45
    status = migration["status"]
    assert status["result"] == "RolledBack", status
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", reason), failed
    assert says in failed["message"] and says in status["message"]
    warnings = [(r, m) for t, r, m in await world.events("never-m10") if t == "Warning"]
    assert any(r == reason and says in m for r, m in warnings), warnings
    body = await world.wait_running("m10", epoch=1)
    assert body["status"]["ownerPod"] == source
    await eventually(lambda: _only(world, "m10", source), timeout=30)  # no shadow left


async def test_a_target_image_that_fails_rolls_back_and_the_session_keeps_serving(
    world: World,
) -> None:
    await world.apply(session_manifest("m3"))
    body = await world.wait_running("m3", epoch=1)
    source = body["status"]["ownerPod"]
    migration_name = await bump(world, "m3", "python:local")  # not an agent: it exits
    migration = await world.wait_finished(migration_name)
    status = migration["status"]
    assert status["result"] == "RolledBack"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Failed"] == "True"
    body = await world.wait_running("m3", epoch=1)
    assert body["status"]["ownerPod"] == source and body["status"]["image"] == "refagent:v1"

    async def degraded() -> dict[str, str] | None:
        conditions = (await world.session("m3"))["status"]["conditions"]
        found = [c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"]
        return found[0] if found else None

    condition = await eventually(degraded, timeout=30)
    assert migration_name in condition["message"]
    await eventually(lambda: _only(world, "m3", source), timeout=30)  # no shadow left


async def test_an_image_that_cannot_read_the_state_fails_as_incompatible(world: World) -> None:
    # v2 writes state schema 2; v1 reads only 1: moving back is refused by v1 itself.
    await world.apply(session_manifest("m4", image="refagent:v2"))
    await world.wait_running("m4", epoch=1)
    # A turn answered first, so that v2's state holds values in its schema: an empty
    # state is any schema's, and v1 would rightly take it over.
    async with world.client() as client:
        session = world.gateway_session("m4")
        await client.post_message(session, "my name is Ada", id="m4-name")
        await eventually(lambda: reply_counts(client, session), timeout=30)
    migration_name = await bump(world, "m4", "refagent:v1")
    migration = await world.wait_finished(migration_name)
    status = migration["status"]
    assert status["result"] == "RolledBack"
    reasons = {c["type"]: c["reason"] for c in status["conditions"]}
    assert reasons["Failed"] == "IncompatibleStateSchema", status
    body = await world.wait_running("m4", epoch=1)
    assert body["status"]["image"] == "refagent:v2"


async def test_deleting_a_running_migration_cancels_it_and_the_source_keeps_the_session(
    world: World,
) -> None:
    await world.apply(session_manifest("m5", migration={"catchUpLagThreshold": 0}))
    body = await world.wait_running("m5", epoch=1)
    source = body["status"]["ownerPod"]
    # A shadow that never becomes ready (the image sleeps): the migration waits in Restoring.
    await world.apply(manual_migration("cancel-m5", "m5", image="sleeper:local"))

    async def restoring() -> bool:
        found = await world.migration("cancel-m5")
        return bool(found and (found.get("status") or {}).get("phase") == "Restoring")

    await eventually(restoring, timeout=60)
    await world.raw.delete(world.path("agentmigrations", "cancel-m5"))
    await eventually(lambda: _gone_migration(world, "cancel-m5"), timeout=60)
    body = await world.wait_running("m5", epoch=1)
    assert body["status"]["ownerPod"] == source
    await eventually(lambda: _only(world, "m5", source), timeout=30)
    # The session still says what became of it, once the AgentMigration is gone too.
    body = await world.wait_settled("m5", epoch=1)
    last = body["status"]["lastMigration"]
    assert (last["name"], last["result"], last["reason"]) == (
        "cancel-m5",
        "RolledBack",
        "Cancelled",
    )
    assert "activeMigration" not in body["status"]
    degraded = next(c for c in body["status"]["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Cancelled")
    assert "cancel-m5" in degraded["message"]


async def test_a_migration_that_cannot_start_for_the_gateway_is_tried_again_until_it_can(
    world: World,
) -> None:
    """The daemon's error path: the gateway away when a migration starts is said on the
    AgentMigration (a Warning event, the error counted), and the migration starts once
    the gateway is back."""
    await world.nodes.add_node("node-2")
    await world.apply(session_manifest("m8"))
    body = await world.wait_running("m8", epoch=1)
    there = "node-2" if body["status"]["nodeName"] == "node-1" else "node-1"
    await world.gateway.stop(kill=True)
    # A move to another node: a move to another image than spec.image would be moved
    # back by the session's reconciler (spec.image is what the session should run).
    await world.apply(manual_migration("move-m8", "m8", nodeName=there))

    async def warned() -> list[str] | None:
        said = [
            m
            for t, r, m in await world.events("move-m8")
            if (t, r) == ("Warning", "GatewayUnavailable")
        ]
        return said or None

    said = await eventually(warned, timeout=60)
    assert "trying again" in said[0], said
    errors = world.metrics.registry.get_sample_value(
        "shadowpod_reconcile_errors_total",
        {"kind": "AgentMigration", "reason": "GatewayUnavailable"},
    )
    assert errors is not None and errors >= 1

    await world.gateway.start()
    migration = await world.wait_finished("move-m8", timeout=180)
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")
    body = await world.wait_settled("m8", epoch=2)
    assert body["status"]["nodeName"] == there
    assert body["status"]["lastMigration"]["name"] == "move-m8"


async def test_an_operator_restarted_mid_migration_finishes_it(world: World) -> None:
    await world.apply(session_manifest("m6"))
    await world.wait_running("m6", epoch=1)
    async with Load(world, "m6", rate=10) as load:
        migration_name = await bump(world, "m6", "refagent:v2")

        async def catching_up() -> bool:
            found = await world.migration(migration_name)
            phase = (found.get("status") or {}).get("phase") if found else None
            return phase in ("Restoring", "CatchingUp", "Fencing", "Committed")

        await eventually(catching_up, timeout=60)
        await world.stop_operator()
        await world.start_operator()
        migration = await world.wait_finished(migration_name)
        await world.wait_running("m6", epoch=2)
        assert await load.stop()
        broken = invariants(load, [migration])
    assert broken == {}
    assert migration["status"]["result"] == "Succeeded"
    assert World.record(migration).recoveries >= 1


async def test_a_cordoned_node_is_drained_after_its_sessions_moved_live(
    world: World,
) -> None:
    await world.nodes.add_node("node-2")
    await world.apply(session_manifest("m7"))
    body = await world.wait_running("m7", epoch=1)
    node, old_owner = body["status"]["nodeName"], body["status"]["ownerPod"]
    evicted_at: dict[str, float] = {}
    async with world.kube.api() as api:
        await drain(api, node, timeout=120, evicted_at=evicted_at)
    body = await world.wait_settled("m7", epoch=2)
    assert body["status"]["nodeName"] not in (None, node)
    assert body["status"]["lastMigration"]["reason"] == "NodeDrain"
    assert body["status"]["lastMigration"]["result"] == "Succeeded"
    assert body["status"]["lastMigration"]["name"].startswith("m7-drain-")
    # The owner was never evicted: it moved live first. Once the epoch is bumped the
    # old pod is no owner and its budget no longer covers it; the drain may then evict
    # it while the operator drains and deletes it, as a real `kubectl drain` would.
    migration = await world.migration(body["status"]["lastMigration"]["name"])
    assert migration is not None
    committed = World.record(migration).timings[Phase.COMMITTED].started
    if (at := evicted_at.get(f"{world.namespace}/{old_owner}")) is not None:
        assert at >= committed, f"the owner was evicted {committed - at:.3f} s before the bump"
    async with world.kube.api() as api:
        await cordon(api, node, unschedulable=False)


async def _gone(world: World, pod: str) -> bool:
    return await world.raw.get(world.path("pods", pod)) is None


async def _gone_migration(world: World, name: str) -> bool:
    return await world.migration(name) is None


async def _only(world: World, session: str, pod: str) -> bool:
    return [p["metadata"]["name"] for p in await world.pods(session)] == [pod]


RESUMABLE = [
    "Preflight",
    "Snapshotting",
    "Restoring",
    "CatchingUp",
    "Fencing",
    "Committed",
    "Draining",
]


@pytest.mark.parametrize("phase", RESUMABLE)
async def test_an_operator_that_dies_after_saving_any_phase_is_resumed_by_the_next(
    world: World, phase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator stops dead right after it saved ``phase`` (its daemon hangs there
    until the operator is stopped, as a killed process would); a new one finishes the
    migration from the record, with nothing lost or answered twice."""
    saved_at_phase = threading.Event()
    save = MigrationRecords.save

    async def dies_after(self: MigrationRecords, record: MigrationRecord) -> None:
        await save(self, record)
        if record.phase == phase:
            saved_at_phase.set()
            await asyncio.sleep(3600)  # cancelled when the operator stops

    await world.apply(session_manifest("r1"))
    await world.wait_running("r1", epoch=1)
    async with Load(world, "r1", rate=10) as load:
        monkeypatch.setattr(MigrationRecords, "save", dies_after)
        migration_name = await bump(world, "r1", "refagent:v2")
        assert await asyncio.to_thread(saved_at_phase.wait, 60)
        await world.stop_operator()
        monkeypatch.setattr(MigrationRecords, "save", save)
        await world.start_operator()
        migration = await world.wait_finished(migration_name)
        await world.wait_running("r1", epoch=2)
        assert await load.stop()
        broken = invariants(load, [migration])
    assert broken == {}
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")
    assert World.record(migration).recoveries == 1
    await eventually(lambda: _count_pods(world, "r1", 1), timeout=30)  # nothing left behind


async def _count_pods(world: World, session: str, count: int) -> bool:
    return len(await world.pods(session)) == count


async def test_an_image_change_during_a_migration_waits_for_it_then_runs(world: World) -> None:
    await world.apply(session_manifest("q1"))
    await world.wait_running("q1", epoch=1)
    first = await bump(world, "q1", "refagent:v2")
    second = await bump(world, "q1", "refagent:v2-b")  # while the first one runs
    done_first = await world.wait_finished(first)
    done_second = await world.wait_finished(second)
    assert done_first["status"]["result"] == "Succeeded"
    assert done_second["status"]["result"] == "Succeeded", done_second["status"].get("message")
    # Never side by side: the second started after the first had finished.
    assert World.record(done_second).started >= World.record(done_first).ended  # type: ignore[operator]
    body = await world.wait_running("q1", epoch=3)
    assert body["status"]["image"] == "refagent:v2-b"

    async def last_is_second() -> dict[str, Any] | None:
        status = (await world.session("q1")).get("status") or {}
        last = status.get("lastMigration") or {}
        return last if last.get("name") == second else None

    last = await eventually(last_is_second, timeout=30)
    assert (last["result"], last["reason"]) == ("Succeeded", "ImageChange")
    assert (last["sourceImage"], last["targetImage"]) == ("refagent:v2", "refagent:v2-b")
    assert last["durationMilliseconds"] > 0
    # The same pause as the AgentMigration's (none without a message held back).
    assert last.get("fencePauseMilliseconds") == done_second["status"].get("fencePauseMilliseconds")
    assert last["completionTime"] >= last["startTime"]


@pytest.mark.stand_in(
    "counts the operator's requests in the emulator's request log, with the shadow "
    "held in ContainerCreating by the stand-in (kubelet.held); a real API server "
    "counts no request by object, and a real kubelet holds no pod on cue"
)
async def test_a_migration_waiting_for_its_shadow_pod_reads_it_a_few_times_a_second(
    world: World, emulator: ApiServerEmulator, kubelet: Kubelet
) -> None:
    """The engine polls an instance every 10-50 ms; the operator reads the pod behind
    it from the API server at most twice a second. At the engine's pace, 100 moves at
    once were 2,000+ GETs a second, and the real API server answered none in time
    (issue 23). Counted here: GETs of the held shadow pod over a few seconds."""
    await world.apply(session_manifest("m12"))
    await world.wait_running("m12", epoch=1)
    migration_name = names.image_migration("m12", 2)
    kubelet.held[names.MIGRATION_LABEL] = migration_name
    await bump(world, "m12", "refagent:v2")

    async def shadow() -> str | None:
        found = await world.migration(migration_name)
        record = None if found is None else stored_record(found)
        return None if record is None else record.spec.target.name

    target = await eventually(shadow, timeout=60)
    path = world.path("pods", target)

    def reads() -> int:
        return sum(1 for r in emulator if r.method == "GET" and r.url.path == path)

    await eventually(lambda: reads() > 0, timeout=30)
    window_s = 4.0
    before = reads()
    await asyncio.sleep(window_s)
    per_s = (reads() - before) / window_s
    assert await _phase_of(world, migration_name) == "Restoring"  # waited all along
    assert per_s <= 3.0, f"{per_s:.1f} GETs a second of the pod {target}"
    kubelet.held.clear()
    migration = await world.wait_finished(migration_name)
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")


async def _phase_of(world: World, migration: str) -> str | None:
    found = await world.migration(migration)
    return None if found is None else (found.get("status") or {}).get("phase")
