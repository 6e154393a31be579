"""The image-bump migration with every part in a container of the real image: the
gateway and the operator as the Helm chart runs them, and the agent pods the operator
makes run by the kubelet fixture's container mode (tests/kube/kubelet/docker.py) from
``shadowpod-refagent:v1`` and ``:v2`` — all read-only, non-root, without capabilities,
on the host's network. The emulated API server and the kubelet stand-in are the only
parts left in the test's process (there is no cluster here).

The same checks as the operator's process-mode test (tests/kube/
test_operator_migrations.py): under client load, 0 lost, 0 duplicated, 0 reordered,
one version per reply, v2 answering with v1's memory.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shadowpod.kube import names
from tests.image.docker import USER, Container, Containers, Images, docker
from tests.image.support import (
    GatewayContainer,
    loopback_address,
    wait_ready,
)
from tests.kube.connection import KubeConnection
from tests.kube.kubelet import Kubelet
from tests.kube.operator_world import Load, World, bump, invariants, session_manifest
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(1500)  # the first test of a run builds the image

NAMESPACE = "default"


@dataclass(frozen=True)
class OperatorContainer:
    container: Container
    metrics_url: str

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as http, http.get(self.metrics_url) as response:
            assert response.status == 200
            return await response.text()


@pytest.fixture
async def operator(
    images: Images,
    containers: Containers,
    gateway: GatewayContainer,
    gateway_files: tuple[Path, Path],
    kube: KubeConnection,
) -> AsyncIterator[OperatorContainer]:
    """The operator in a container of the image, as the chart runs it; stopped (as its
    pod would be) before the emulated API goes, whose open watches it holds."""
    _, secrets = gateway_files
    host, port = loopback_address()
    metrics_host, metrics_port = loopback_address()
    container = await containers.run(
        images.shadowpod,
        [
            "operator",
            f"--namespace={NAMESPACE}",
            f"--liveness=http://{host}:{port}/healthz",
            f"--metrics-host={metrics_host}",
            f"--metrics-port={metrics_port}",
            "--reconcile-interval=1",
            "--log-format=text",
        ],
        env={
            "KUBECONFIG": "/etc/shadowpod/kube/kubeconfig",
            "SHADOWPOD_GATEWAY_URL": gateway.url,
            "SHADOWPOD_CONTROL_TOKEN_FILE": "/etc/shadowpod/gateway/control-token",
        },
        mounts={kube.kubeconfig.parent: "/etc/shadowpod/kube", secrets: "/etc/shadowpod/gateway"},
    )
    await wait_ready(f"http://{host}:{port}/healthz", container)
    yield OperatorContainer(container, f"http://{metrics_host}:{metrics_port}/metrics")
    assert await container.stop(grace_s=30) == 0


async def hardening_of(container: str) -> dict[str, object]:
    """What Docker says the container runs with."""
    found = json.loads(await docker("inspect", container))[0]
    host = found["HostConfig"]
    return {
        "image": found["Config"]["Image"],
        "user": found["Config"]["User"],
        "read-only root": host["ReadonlyRootfs"],
        "network": host["NetworkMode"],
        "capabilities dropped": host["CapDrop"],
        "tmpfs": sorted(host.get("Tmpfs") or {}),
        "mounts": sorted(
            (m["Destination"], m["RW"]) for m in found["Mounts"] if m["Type"] == "bind"
        ),
    }


async def test_an_image_bump_migrates_live_between_containers_of_the_real_image(
    images: Images,
    gateway: GatewayContainer,
    operator: OperatorContainer,
    kube: KubeConnection,
    kubelet: Kubelet,
) -> None:
    v1, v2 = images.refagent[1], images.refagent[2]
    async with kube.api() as api:
        world = World(api, kube, gateway, NAMESPACE)
        await world.apply(session_manifest("c1", image=v1))
        body = await world.wait_running("c1", epoch=1, timeout=120)
        source = body["status"]["ownerPod"]
        (pod,) = await world.pods("c1")
        (status,) = pod["status"]["containerStatuses"]
        assert status["containerID"].startswith("docker://")
        owner_container = status["containerID"].removeprefix("docker://")
        # The owner runs from the v1 image, hardened as the chart's pods are.
        assert await hardening_of(owner_container) == {
            "image": v1,
            "user": USER,
            "read-only root": True,
            "network": "host",
            "capabilities dropped": ["ALL"],
            "tmpfs": ["/tmp"],
            "mounts": [(names.TERMINATION_LOG, True), (names.IDENTITY_DIR, False)],
        }

        async with Load(world, "c1", rate=20) as load:
            await eventually(lambda: load.load.replies, timeout=60)
            migration_name = await bump(world, "c1", v2)
            migration = await world.wait_finished(migration_name, timeout=180)
            body = await world.wait_settled("c1", epoch=2, timeout=120)
            assert await load.stop(), "some accepted messages were never answered"
            broken = invariants(load, [migration])
            versions = {r.version for replies in load.load.replies.values() for r in replies}
            print(f"{len(load.load.sent)} messages sent, answered by versions {sorted(versions)}")
        assert broken == {}
        assert versions == {"1", "2"}  # the checks above had replies of both to judge
        status = migration["status"]
        assert status["result"] == "Succeeded", status.get("message")
        assert status["fence"]["epoch"] == 2

        # v2, in a container of its own image, owns the session; v1's pod is gone.
        assert body["status"]["image"] == v2
        target = body["status"]["ownerPod"]
        assert target != source and target == status["target"]["pod"]

        async def source_gone() -> bool:
            return await world.raw.get(world.path("pods", source)) is None

        await eventually(source_gone, timeout=60)
        (pod,) = await world.pods("c1")
        owner_container = pod["status"]["containerStatuses"][0]["containerID"]
        assert (await hardening_of(owner_container.removeprefix("docker://")))["image"] == v2

    # The operator, in its container, counted it.
    counted = {
        (sample.labels["result"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(await operator.metrics())
        if family.name == "shadowpod_migrations"
        for sample in family.samples
        if sample.name == "shadowpod_migrations_total"
    }
    assert counted == {("Succeeded", "ImageChange"): 1.0}
