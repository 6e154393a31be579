"""Fixtures for tests that need a Kubernetes API: the emulator (always), or a real
cluster when ``SHADOWPOD_TEST_KUBECONFIG`` names one.

- ``emulator``: an ``ApiServerEmulator`` on 127.0.0.1 serving the tests' CRDs
  (``tests/kube/crds``) and the operator's (``crds/``, once there);
- ``kube``: a ``KubeConnection`` (a kubeconfig Kopf and kubernetes_asyncio both read),
  parametrized over the emulator and the real cluster — the real-cluster variant
  skips, saying why, when no cluster is given;
- ``api``: a kubernetes_asyncio client on ``kube``; ``namespace``: a fresh namespace
  per test, deleted afterwards.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
from kubernetes_asyncio import client

from shadowpod.local.images import ImageMap, reference_images
from tests.kube.connection import KubeConnection, no_real_cluster_reason, real_cluster_kubeconfig
from tests.kube.emulator import ApiServerEmulator
from tests.kube.kubelet import Kubelet
from tests.kube.operator_world import World, world_of
from tests.kube.support import Widgets, ensure_widget_crd

TEST_CRDS = Path(__file__).parent / "crds"
OPERATOR_CRDS = Path(__file__).parents[2] / "crds"


def crd_sources() -> list[Path]:
    return [path for path in (TEST_CRDS, OPERATOR_CRDS) if path.is_dir()]


@pytest.fixture
async def emulator() -> AsyncIterator[ApiServerEmulator]:
    async with ApiServerEmulator(crds=crd_sources()) as server, kmock.Server(server):
        yield server
    # A 500 the emulator answered is its own bug, whatever the test made of it.
    assert server.internal_errors == []


@pytest.fixture
def emulator_kube(emulator: ApiServerEmulator, tmp_path: Path) -> KubeConnection:
    return KubeConnection.to_emulator(str(emulator.url).rstrip("/"), tmp_path)


@pytest.fixture(params=["emulator", "real-cluster"])
def kube(request: pytest.FixtureRequest, tmp_path: Path) -> KubeConnection:
    if request.param == "emulator":
        connection: KubeConnection = request.getfixturevalue("emulator_kube")
        return connection
    kubeconfig = real_cluster_kubeconfig()
    if kubeconfig is None:
        pytest.skip(no_real_cluster_reason())
    return KubeConnection(kubeconfig, real=True)


@pytest.fixture
async def api(kube: KubeConnection) -> AsyncIterator[client.ApiClient]:
    async with kube.api() as api_client:
        yield api_client


@pytest.fixture
async def namespace(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    await core.delete_namespace(name)


@pytest.fixture
async def widgets(api: client.ApiClient, namespace: str) -> Widgets:
    """The tests' custom resource in ``namespace`` (its CRD installed where missing)."""
    await ensure_widget_crd(api)
    return Widgets(api, namespace)


def local_images() -> ImageMap:
    """The reference agents (``refagent:v1`` …, also as ``shadowpod-refagent:v1``, :v2),
    ``python:local`` (this interpreter) and
    ``sleeper:local`` (a process that does nothing for an hour)."""
    images = dict(reference_images().images)
    extra = ImageMap.from_data(
        {
            "images": {
                "python:local": {"command": [sys.executable]},
                # Never ready, never done: a shadow that keeps a migration waiting.
                "sleeper:local": {
                    "command": [sys.executable, "-c", "import time; time.sleep(3600)"]
                },
            }
        }
    )
    images.update(extra.images)
    # The names `make image` gives the reference agent's images, which
    # examples/02-kubernetes uses (as on a real cluster).
    for version in ("v1", "v2"):
        images[f"shadowpod-refagent:{version}"] = images[f"refagent:{version}"]
    return ImageMap(images=images)


@pytest.fixture
async def kubelet(emulator_kube: KubeConnection, tmp_path: Path) -> AsyncIterator[Kubelet]:
    """A kubelet and scheduler on the emulator with one node, ``node-1``; add more with
    ``await kubelet.add_node(name)``. Pods run as local processes."""
    async with (
        emulator_kube.api() as api_client,
        Kubelet(api_client, local_images(), tmp_path / "kubelet") as running,
    ):
        await running.add_node("node-1")
        yield running


@pytest.fixture
async def world(
    emulator_kube: KubeConnection, kubelet: Kubelet, tmp_path: Path
) -> AsyncIterator[World]:
    """The operator running in a Kopf thread against the emulator, the kubelet and a
    real gateway, serving namespace ``default``."""
    async for running in world_of(emulator_kube, "default", tmp_path):
        await running.start_operator()
        yield running
