"""The CRIU path under the operator, against the emulated API server's node proxy
(each node's kubelet checkpoint API answers as the test says) and the kubelet
stand-in running pods as processes: which path ``Auto`` takes and why, the kubelet's
error answers (404: the feature gate off; 500: the runtime cannot), the fallback to
the app-level path (``Auto``) and the rollback (``CRIU``), and the shadow pod made
from the checkpoint image."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shadowpod.kube.checkpoints import RESTORED_FROM_ANNOTATION
from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.kube.strategies import CHECKPOINT_RESTORE_LABEL
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.emulator.kubelets import (
    CHECKPOINTS,
    FEATURE_GATE_OFF,
    NODE_PROXY_FORBIDDEN,
    RUNTIME_UNIMPLEMENTED,
    CheckpointAnswer,
)
from tests.kube.kubelet import Kubelet
from tests.kube.operator_world import World, session_manifest, world_of
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(120)
REGISTRY = "127.0.0.1:5000/checkpoints"


@pytest.fixture
async def criu_world(
    emulator_kube: KubeConnection, kubelet: Kubelet, tmp_path: Path
) -> AsyncIterator[World]:
    """The operator with ``--criu`` and a checkpoint registry; two nodes."""
    await kubelet.add_node("node-2")
    async for running in world_of(emulator_kube, "default", tmp_path):
        running.criu = True
        running.checkpoint_registry = REGISTRY
        await running.start_operator()
        yield running


def move(name: str, session: str, node: str, strategy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"sessionRef": {"name": session}, "target": {"nodeName": node}}
    if strategy is not None:
        spec["strategy"] = strategy
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentMigration",
        "metadata": {"name": name},
        "spec": spec,
    }


async def label_nodes(world: World, *nodes: str) -> None:
    for node in nodes:
        labels = {"metadata": {"labels": {CHECKPOINT_RESTORE_LABEL: "true"}}}
        assert await world.raw.patch(f"/api/v1/nodes/{node}", labels) is not None


async def start_session(world: World, name: str, **policy: Any) -> tuple[str, str, str]:
    """The session running; its owner pod, that pod's node and the other node."""
    await world.apply(session_manifest(name, migration=policy))
    body = await world.wait_running(name, epoch=1)
    here = body["status"]["nodeName"]
    return body["status"]["ownerPod"], here, "node-2" if here == "node-1" else "node-1"


@pytest.mark.stand_in(
    "the emulator answers each node's kubelet checkpoint API as the test says and counts "
    "the requests; a real kubelet's answer cannot be chosen"
)
async def test_auto_takes_the_state_path_without_criu_and_says_why(
    world: World, kubelet: Kubelet, emulator: ApiServerEmulator
) -> None:
    await kubelet.add_node("node-2")
    _, here, there = await start_session(world, "a1")
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = CHECKPOINTS
    await world.apply(move("move-a1", "a1", there))
    migration = await world.wait_finished("move-a1")
    status = migration["status"]
    assert status["result"] == "Succeeded", status.get("message")
    assert status["strategy"] == "State"
    assert "without --criu" in status["strategyMessage"]
    assert emulator.checkpoint_requests == []  # the kubelet was never asked
    events = await world.events("move-a1")
    assert any(r == "StrategyChosen" and "State" in m for _, r, m in events)


async def test_strategy_criu_without_criu_fails_at_once_saying_so(world: World) -> None:
    await world.nodes.add_node("node-2")
    source, here, there = await start_session(world, "a0")
    await world.apply(move("move-a0", "a0", there, strategy="CRIU"))
    status = (await world.wait_finished("move-a0"))["status"]
    assert (status["result"], status["strategy"]) == ("RolledBack", "CRIU")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (status["failedPhase"], failed["reason"]) == (
        "Preflight",
        "CheckpointRestoreUnsupported",
    )
    assert "without --criu" in status["strategyMessage"]
    body = await world.wait_running("a0", epoch=1)
    assert (body["status"]["ownerPod"], body["status"]["nodeName"]) == (source, here)


async def test_auto_takes_the_state_path_where_the_node_cannot_checkpoint(
    criu_world: World, emulator: ApiServerEmulator
) -> None:
    world = criu_world
    _, here, there = await start_session(world, "a2")  # no node labelled
    emulator.kubelet_checkpoints[here] = CHECKPOINTS
    await world.apply(move("move-a2", "a2", there))
    status = (await world.wait_finished("move-a2"))["status"]
    assert status["result"] == "Succeeded", status.get("message")
    assert status["strategy"] == "State"
    assert f"{here} is not labelled {CHECKPOINT_RESTORE_LABEL}=true" in status["strategyMessage"]
    assert emulator.checkpoint_requests == []


@pytest.mark.parametrize(
    ("kubelet_answer", "said"),
    [(FEATURE_GATE_OFF, "answered 404"), (RUNTIME_UNIMPLEMENTED, "Unimplemented")],
    ids=["feature-gate-off", "runtime-unimplemented"],
)
async def test_auto_falls_back_to_the_state_path_when_the_kubelet_cannot_checkpoint(
    criu_world: World,
    emulator: ApiServerEmulator,
    kubelet_answer: CheckpointAnswer,
    said: str,
) -> None:
    world = criu_world
    source, here, there = await start_session(world, "a3")
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = kubelet_answer
    await world.apply(move("move-a3", "a3", there))
    status = (await world.wait_finished("move-a3"))["status"]
    # Auto chose CRIU; the kubelet said it cannot; the session moved on the state path.
    assert status["result"] == "Succeeded", status.get("message")
    assert status["strategy"] == "State"
    assert said in status["strategyMessage"]
    assert "fell back to the app-level state path" in status["strategyMessage"]
    [asked] = emulator.checkpoint_requests
    assert (asked.node, asked.namespace, asked.pod, asked.container) == (
        here,
        "default",
        source,
        "agent",
    )
    assert asked.timeout == "60"
    body = await world.wait_running("a3", epoch=2)
    assert body["status"]["nodeName"] == there
    events = await world.events("move-a3")
    assert any(r == "StrategyChosen" and "CRIU" in m for _, r, m in events)
    assert any(t == "Warning" and r == "CheckpointFallback" for t, r, _ in events)
    assert any(r == "CheckpointFallback" for _, r, _ in await world.events("a3"))


async def test_strategy_criu_rolls_back_when_the_runtime_cannot_checkpoint(
    criu_world: World, emulator: ApiServerEmulator
) -> None:
    world = criu_world
    source, here, there = await start_session(world, "c1")
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = RUNTIME_UNIMPLEMENTED
    await world.apply(move("move-c1", "c1", there, strategy="CRIU"))
    status = (await world.wait_finished("move-c1"))["status"]
    assert (status["result"], status["strategy"]) == ("RolledBack", "CRIU")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "CheckpointRestoreUnsupported")
    assert "does not implement checkpoints" in failed["message"]
    assert status["failedPhase"] == "Snapshotting"
    body = await world.wait_running("c1", epoch=1)
    assert (body["status"]["ownerPod"], body["status"]["nodeName"]) == (source, here)
    await eventually(lambda: only_pod(world, "c1", source), timeout=30)


async def test_strategy_criu_rolls_back_when_the_target_node_cannot_restore(
    criu_world: World, emulator: ApiServerEmulator
) -> None:
    world = criu_world
    source, here, there = await start_session(world, "c2")
    await label_nodes(world, here)  # the target node does not say it restores
    emulator.kubelet_checkpoints[here] = CHECKPOINTS
    await world.apply(move("move-c2", "c2", there, strategy="CRIU"))
    status = (await world.wait_finished("move-c2"))["status"]
    assert status["result"] == "RolledBack"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "CheckpointRestoreUnsupported"
    assert f"node {there} cannot restore a checkpoint" in failed["message"]
    assert status["failedPhase"] == "Restoring"
    assert len(emulator.checkpoint_requests) == 1  # checkpointed, never restored
    await eventually(lambda: only_pod(world, "c2", source), timeout=30)


async def test_a_checkpoint_becomes_a_shadow_pod_of_the_checkpoint_image(
    criu_world: World, emulator: ApiServerEmulator
) -> None:
    """Auto on CRIU with a kubelet that checkpoints: the shadow pod runs the image the
    node agent pushes for the archive. No node agent runs here, so it waits in image
    pull until the phase times out and the migration rolls back."""
    world = criu_world
    source, here, there = await start_session(world, "c3", phaseTimeoutSeconds=4)
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = CHECKPOINTS
    await world.apply(move("move-c3", "c3", there))

    async def shadow() -> dict[str, Any] | None:
        pods = [p for p in await world.pods("c3") if p["metadata"]["name"] != source]
        return pods[0] if pods else None

    pod = await eventually(shadow, timeout=30)
    [container] = pod["spec"]["containers"]
    stamp_free = f"{REGISTRY}/checkpoint:checkpoint-{source}_default-agent-"
    assert container["image"].startswith(stamp_free)
    restored_from = pod["metadata"]["annotations"][RESTORED_FROM_ANNOTATION]
    assert restored_from.startswith(f"{here}:/var/lib/kubelet/checkpoints/checkpoint-{source}_")
    assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == there
    status = (await world.wait_finished("move-c3"))["status"]
    assert (status["result"], status["strategy"]) == ("RolledBack", "CRIU")
    assert status["failedPhase"] == "Restoring"
    assert "a CRIU checkpoint" in status["strategyMessage"]
    await eventually(lambda: only_pod(world, "c3", source), timeout=30)


RESTORE_OFF = (
    "checkpoint restore is disabled: checkpoint_restore.container_level_enabled is checkpoint_only"
)


@pytest.mark.parametrize("strategy", [None, "CRIU"], ids=["auto", "criu"])
async def test_a_runtime_that_will_not_restore_falls_back_or_rolls_back(
    criu_world: World, emulator: ApiServerEmulator, kubelet: Kubelet, strategy: str | None
) -> None:
    """The kubelet checkpoints, the target node says it restores, but its runtime will
    not make the container (restore off, as CRI-O's 2026 default): Auto moves the
    session on the state path; CRIU rolls back."""
    world = criu_world
    name = f"r{'a' if strategy is None else 'c'}"
    source, here, there = await start_session(world, name)
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = CHECKPOINTS
    kubelet.restore_refusals[there] = RESTORE_OFF
    await world.apply(move(f"move-{name}", name, there, strategy=strategy))
    status = (await world.wait_finished(f"move-{name}"))["status"]
    if strategy is None:
        assert (status["result"], status["strategy"]) == ("Succeeded", "State"), status
        assert "did not restore the checkpoint (CreateContainerError" in status["strategyMessage"]
        assert "checkpoint_only" in status["strategyMessage"]
        body = await world.wait_running(name, epoch=2)
        assert body["status"]["nodeName"] == there
        await eventually(lambda: only_pod(world, name, body["status"]["ownerPod"]), timeout=30)
        [owner] = await world.pods(name)
        assert "/checkpoint:" not in owner["spec"]["containers"][0]["image"]  # the state path
    else:
        assert (status["result"], status["strategy"]) == ("RolledBack", "CRIU")
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "CheckpointRestoreUnsupported"
        assert "checkpoint_only" in failed["message"]
        assert status["failedPhase"] == "Restoring"
        await world.wait_running(name, epoch=1)
        await eventually(lambda: only_pod(world, name, source), timeout=30)


@pytest.mark.parametrize("strategy", [None, "CRIU"], ids=["auto", "criu"])
async def test_a_forbidden_node_proxy_says_to_enable_the_chart_switch(
    criu_world: World, emulator: ApiServerEmulator, strategy: str | None
) -> None:
    """The API server answers 403 (no RBAC nodes/proxy create): a NodeProxyForbidden
    Warning on the migration and the session saying to set operator.criu; Auto moves
    the session on the state path, CRIU rolls back with that reason."""
    world = criu_world
    name = f"f{'a' if strategy is None else 'c'}"
    source, here, there = await start_session(world, name)
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = NODE_PROXY_FORBIDDEN
    await world.apply(move(f"move-{name}", name, there, strategy=strategy))
    status = (await world.wait_finished(f"move-{name}"))["status"]
    switch = "operator.criu=true"
    if strategy is None:
        assert (status["result"], status["strategy"]) == ("Succeeded", "State"), status
        assert switch in status["strategyMessage"]
        assert "fell back to the app-level state path" in status["strategyMessage"]
        await world.wait_running(name, epoch=2)
    else:
        assert (status["result"], status["strategy"]) == ("RolledBack", "CRIU")
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert (failed["reason"], status["failedPhase"]) == ("NodeProxyForbidden", "Snapshotting")
        assert switch in failed["message"]
        assert 'cannot create resource "nodes/proxy"' in failed["message"]
        body = await world.wait_running(name, epoch=1)
        assert body["status"]["ownerPod"] == source
    for obj in (f"move-{name}", name):
        said = [(t, m) for t, r, m in await world.events(obj) if r == "NodeProxyForbidden"]
        assert said and said[0][0] == "Warning" and switch in said[0][1], (obj, said)


async def only_pod(world: World, session: str, pod: str) -> bool:
    """Only ``pod`` is left of the session's pods (a deleted one is gone in its own time)."""
    return [p["metadata"]["name"] for p in await world.pods(session)] == [pod]
