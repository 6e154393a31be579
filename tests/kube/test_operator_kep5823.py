"""The CRIU path through KEP-5823's API, where the cluster serves it: the emulated API
server serves ``PodCheckpoint`` (``node.k8s.io/v1alpha1``) and the kubelet stand-in
takes the checkpoints and restores pods from them (``kubelet/podcheckpoints.py``).

The operator prefers it to the kubelet API for a move that stays on the source's node
(the KEP's alpha restores only there), says so in the status, falls back or rolls back
when the kubelet reports the checkpoint or the restore failed, and deletes the
PodCheckpoint once the migration has ended."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest

from shadowpod.engine.record import MigrationRecord
from shadowpod.kube import podcheckpoints
from shadowpod.kube.api import KubeApi
from shadowpod.kube.podcheckpoints import RESTORED_FROM_ANNOTATION
from shadowpod.kube.records import MigrationRecords
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.emulator.kubelets import FEATURE_GATE_OFF
from tests.kube.kubelet import Kubelet
from tests.kube.operator_world import World, world_of
from tests.kube.support import eventually
from tests.kube.test_operator_criu import REGISTRY, label_nodes, move, only_pod, start_session

pytestmark = pytest.mark.timeout(120)
KEP_CRD = Path(__file__).parent / "emulator" / "podcheckpoints.yaml"
UNIMPLEMENTED = (
    "rpc error: code = Unimplemented desc = unknown method CheckpointPod for service"
    " runtime.v1.RuntimeService"
)


@pytest.fixture
async def kep_world(
    emulator: ApiServerEmulator,
    emulator_kube: KubeConnection,
    kubelet: Kubelet,
    tmp_path: Path,
) -> AsyncIterator[World]:
    """A cluster serving PodCheckpoint; the operator with ``--criu``; two nodes, none
    labelled (the served API is the cluster's word)."""
    emulator.load_crds(KEP_CRD)
    kubelet.serve_pod_checkpoints()
    await kubelet.add_node("node-2")
    async for running in world_of(emulator_kube, "default", tmp_path):
        running.criu = True
        running.checkpoint_registry = REGISTRY
        await running.start_operator()
        yield running


def checkpoint_path(world: World, name: str) -> str:
    return podcheckpoints.checkpoint_path("node.k8s.io/v1alpha1", world.namespace, name)


async def test_discovery_finds_the_api_only_where_it_is_served(
    emulator: ApiServerEmulator, emulator_kube: KubeConnection
) -> None:
    async with emulator_kube.api() as api:
        assert await podcheckpoints.served(KubeApi(api)) is None
        emulator.load_crds(KEP_CRD)
        assert await podcheckpoints.served(KubeApi(api)) == "node.k8s.io/v1alpha1"


async def test_auto_takes_a_pod_checkpoint_where_the_api_is_served(
    kep_world: World, emulator: ApiServerEmulator, kubelet: Kubelet
) -> None:
    world = kep_world
    source, here, _ = await start_session(world, "k1")
    await world.apply(move("move-k1", "k1", here))  # a move on the same node
    status = (await world.wait_finished("move-k1"))["status"]
    assert status["result"] == "Succeeded", status.get("message")
    assert (status["strategy"], status["checkpointMechanism"]) == ("CRIU", "PodCheckpoint")
    assert "the cluster serves PodCheckpoint (node.k8s.io/v1alpha1" in status["strategyMessage"]
    assert emulator.checkpoint_requests == []  # never the kubelet API
    shadow = status["target"]["pod"]
    assert kubelet.pod_checkpoints is not None
    assert kubelet.pod_checkpoints.taken == [shadow]  # checkpointed once
    body = await world.wait_running("k1", epoch=2)
    assert (body["status"]["ownerPod"], body["status"]["nodeName"]) == (shadow, here)
    # The old pod was deleted as the move ended; Kubernetes removes it in its own time.
    await eventually(lambda: only_pod(world, "k1", shadow), timeout=30)
    [owner] = await world.pods("k1")
    assert owner["metadata"]["name"] == shadow
    assert owner["spec"]["restoreFrom"] == shadow
    assert owner["metadata"]["annotations"][RESTORED_FROM_ANNOTATION] == f"PodCheckpoint/{shadow}"
    template = kubelet.pod_checkpoints.templates[shadow]["spec"]
    assert owner["spec"]["containers"] == template["containers"]  # as admission checks
    assert await world.raw.get(checkpoint_path(world, shadow)) is None  # deleted after
    assert source not in [p["metadata"]["name"] for p in await world.pods("k1")]


async def test_a_move_to_another_node_takes_the_kubelet_api_saying_why(
    kep_world: World, emulator: ApiServerEmulator, kubelet: Kubelet
) -> None:
    world = kep_world
    _, here, there = await start_session(world, "k2")
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = FEATURE_GATE_OFF
    await world.apply(move("move-k2", "k2", there))
    status = (await world.wait_finished("move-k2"))["status"]
    # The KEP's alpha cannot restore on another node: Auto took the kubelet API, whose
    # 404 sent it down the state path.
    assert (status["result"], status["strategy"]) == ("Succeeded", "State"), status
    assert "answered 404" in status["strategyMessage"]
    [chosen] = [m for _, r, m in await world.events("move-k2") if r == "StrategyChosen"]
    assert "CRIU" in chosen
    assert f"restores only on the node that took the checkpoint ({here})" in chosen
    assert len(emulator.checkpoint_requests) == 1
    assert kubelet.pod_checkpoints is not None and kubelet.pod_checkpoints.taken == []
    body = await world.wait_running("k2", epoch=2)
    assert body["status"]["nodeName"] == there


@pytest.mark.parametrize("strategy", [None, "CRIU"], ids=["auto", "criu"])
async def test_a_failed_pod_checkpoint_falls_back_or_rolls_back(
    kep_world: World, kubelet: Kubelet, strategy: str | None
) -> None:
    world = kep_world
    name = f"kf{'a' if strategy is None else 'c'}"
    source, here, _ = await start_session(world, name)
    kubelet.pod_checkpoint_failures[here] = UNIMPLEMENTED
    await world.apply(move(f"move-{name}", name, here, strategy=strategy))
    status = (await world.wait_finished(f"move-{name}"))["status"]
    shadow = status["target"]["pod"]
    if strategy is None:
        assert (status["result"], status["strategy"]) == ("Succeeded", "State"), status
        assert status.get("checkpointMechanism") is None  # it fell back
        assert "CheckpointFailed: rpc error: code = Unimplemented" in status["strategyMessage"]
        assert "fell back to the app-level state path" in status["strategyMessage"]
        body = await world.wait_running(name, epoch=2)
        owner = await world.raw.get(world.path("pods", body["status"]["ownerPod"]))
        assert owner is not None and "restoreFrom" not in owner["spec"]  # the state path's
        events = await world.events(f"move-{name}")
        assert any(t == "Warning" and r == "CheckpointFallback" for t, r, _ in events)
    else:
        assert (status["result"], status["strategy"]) == ("RolledBack", "CRIU")
        assert status["checkpointMechanism"] == "PodCheckpoint"
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert (failed["reason"], status["failedPhase"]) == (
            "CheckpointRestoreUnsupported",
            "Snapshotting",
        )
        assert "CheckpointFailed" in failed["message"]
        body = await world.wait_running(name, epoch=1)
        assert body["status"]["ownerPod"] == source
    assert await world.raw.get(checkpoint_path(world, shadow)) is None  # deleted after


@pytest.mark.parametrize("strategy", [None, "CRIU"], ids=["auto", "criu"])
async def test_a_restore_the_kubelet_refuses_falls_back_or_rolls_back(
    kep_world: World, kubelet: Kubelet, strategy: str | None
) -> None:
    world = kep_world
    name = f"kr{'a' if strategy is None else 'c'}"
    source, here, _ = await start_session(world, name)
    kubelet.pod_restore_refusals[here] = (
        "PodSpecMismatch",
        "spec.containers[0].image: the restore pod's image is not the checkpoint's digest",
    )
    await world.apply(move(f"move-{name}", name, here, strategy=strategy))
    status = (await world.wait_finished(f"move-{name}"))["status"]
    shadow = status["target"]["pod"]
    assert kubelet.pod_checkpoints is not None and kubelet.pod_checkpoints.taken == [shadow]
    if strategy is None:
        assert (status["result"], status["strategy"]) == ("Succeeded", "State"), status
        assert "did not restore PodCheckpoint" in status["strategyMessage"]
        assert "PodSpecMismatch" in status["strategyMessage"]
        await world.wait_running(name, epoch=2)
    else:
        assert (status["result"], status["strategy"]) == ("RolledBack", "CRIU")
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "CheckpointRestoreUnsupported"
        assert "PodSpecMismatch" in failed["message"]
        assert status["failedPhase"] == "Restoring"
        await world.wait_running(name, epoch=1)

        async def only_source() -> bool:
            return [p["metadata"]["name"] for p in await world.pods(name)] == [source]

        await eventually(only_source, timeout=30)
    assert await world.raw.get(checkpoint_path(world, shadow)) is None  # deleted after


async def test_a_pod_checkpoint_the_api_server_forbids_says_to_enable_the_chart_switch(
    kep_world: World, emulator: ApiServerEmulator, kubelet: Kubelet
) -> None:
    """No RBAC on podcheckpoints (an operator given --criu by hand): Auto moves the
    session on the state path, saying which permission is missing and where."""
    world = kep_world
    emulator["post", kmock.resource("node.k8s.io", "v1alpha1", "podcheckpoints")] << 403
    _, here, _ = await start_session(world, "kp")
    await world.apply(move("move-kp", "kp", here))
    status = (await world.wait_finished("move-kp"))["status"]
    assert (status["result"], status["strategy"]) == ("Succeeded", "State"), status
    assert "podcheckpoints create" in status["strategyMessage"]
    assert "operator.criu=true" in status["strategyMessage"]
    assert kubelet.pod_checkpoints is not None and kubelet.pod_checkpoints.taken == []


@pytest.mark.parametrize("phase", ["Snapshotting", "Restoring", "CatchingUp"])
async def test_an_operator_that_dies_mid_migration_goes_on_through_the_same_checkpoint(
    kep_world: World, kubelet: Kubelet, phase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped dead right after saving ``phase``: the next operator checkpoints the same
    way (the mechanism is kept on the migration), takes no second checkpoint, restores
    from the one taken, and deletes it."""
    world = kep_world
    saved_at_phase = threading.Event()
    save = MigrationRecords.save

    async def dies_after(self: MigrationRecords, record: MigrationRecord) -> None:
        await save(self, record)
        if record.phase == phase:
            saved_at_phase.set()
            await asyncio.sleep(3600)  # cancelled when the operator stops

    name = f"kd{phase[:2].lower()}"
    _, here, _ = await start_session(world, name)
    monkeypatch.setattr(MigrationRecords, "save", dies_after)
    await world.apply(move(f"move-{name}", name, here))
    assert await asyncio.to_thread(saved_at_phase.wait, 60)
    await world.stop_operator()
    monkeypatch.setattr(MigrationRecords, "save", save)
    await world.start_operator()
    migration = await world.wait_finished(f"move-{name}")
    status = migration["status"]
    assert status["result"] == "Succeeded", status.get("message")
    assert (status["checkpointMechanism"], World.record(migration).recoveries) == (
        "PodCheckpoint",
        1,
    )
    shadow = status["target"]["pod"]
    assert kubelet.pod_checkpoints is not None and kubelet.pod_checkpoints.taken == [shadow]
    body = await world.wait_running(name, epoch=2)
    assert body["status"]["ownerPod"] == shadow
    assert await world.raw.get(checkpoint_path(world, shadow)) is None
