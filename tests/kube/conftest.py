"""Fixtures for tests that need a Kubernetes API: the emulator (always), or a real
cluster when ``SHADOWPOD_TEST_KUBECONFIG`` names one.

- ``emulator``: an ``ApiServerEmulator`` on 127.0.0.1 serving the tests' CRDs
  (``tests/kube/crds``) and the operator's (``crds/``, once there);
- ``kube``: a ``KubeConnection`` (a kubeconfig Kopf and kubernetes_asyncio both read),
  parametrized over the emulator and the real cluster — the real-cluster variant
  skips, saying why, when no cluster is given;
- ``api``: a kubernetes_asyncio client on ``kube``; ``namespace``: a fresh namespace
  per test, deleted afterwards;
- ``world``: the operator in a Kopf thread with a real gateway, parametrized the same
  way: on the emulator with the kubelet stand-in (namespace ``default``), or on the
  real cluster, whose kubelets run the pods (a fresh namespace per test; the gateway
  listens where the pods reach this machine). A test that drives the stand-in or the
  emulator itself is marked ``stand_in("why")``: its real-cluster variant skips, saying
  that.
"""

from __future__ import annotations

import gc
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
from kubernetes_asyncio import client

from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.local.images import ImageMap, reference_images
from tests.kube.cluster_images import ensure_test_images
from tests.kube.connection import KubeConnection, no_real_cluster_reason, real_cluster_kubeconfig
from tests.kube.emulator import ApiServerEmulator
from tests.kube.kubelet import Kubelet
from tests.kube.nodes import ClusterNodes
from tests.kube.operator_world import World, world_of
from tests.kube.support import Widgets, ensure_operator_crds, ensure_widget_crd

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


# Where the real cluster's pods reach this machine: `make cluster`'s API server address
# (on lo; the nodes' bridges route pods' packets to it).
CLUSTER_HOST_ENV = "SHADOWPOD_TEST_CLUSTER_HOST"
STAND_IN_FIXTURES = frozenset({"kubelet", "emulator", "emulator_kube"})
_images_ready: set[Path] = set()
_crds_ready: set[Path] = set()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "stand_in(why): an operator test that drives the kubelet stand-in or the emulator "
        "itself; its real-cluster variant skips with WHY",
    )


@pytest.fixture(params=["emulator", "real-cluster"])
def world_kube(request: pytest.FixtureRequest) -> KubeConnection:
    """The API server the operator tests run on (``world``)."""
    if request.param == "emulator":
        request.getfixturevalue("kubelet")
        connection: KubeConnection = request.getfixturevalue("emulator_kube")
        return connection
    marker = request.node.get_closest_marker("stand_in")
    if marker is not None:
        pytest.skip(f"on the kubelet stand-in only: {marker.args[0]}")
    used = STAND_IN_FIXTURES & set(request.fixturenames)
    assert not used, (
        f"{request.node.name} uses {', '.join(sorted(used))}: mark it stand_in(why) "
        "or use world.nodes"
    )
    kubeconfig = real_cluster_kubeconfig()
    if kubeconfig is None:
        pytest.skip(no_real_cluster_reason())
    if kubeconfig not in _images_ready:
        ensure_test_images(kubeconfig)
        _images_ready.add(kubeconfig)
    return KubeConnection(kubeconfig, real=True)


@pytest.fixture
async def world(
    world_kube: KubeConnection, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[World]:
    """The operator running in a Kopf thread with a real gateway: on the emulator and
    the kubelet stand-in (namespace ``default``), or on the real cluster (a namespace
    of its own, removed afterwards)."""
    if not world_kube.real:
        kubelet: Kubelet = request.getfixturevalue("kubelet")
        async for running in world_of(world_kube, "default", tmp_path, nodes=kubelet):
            await running.start_operator()
            yield running
        return
    async with world_kube.api() as api:
        if world_kube.kubeconfig not in _crds_ready:
            await ensure_operator_crds(api)
            _crds_ready.add(world_kube.kubeconfig)
        namespace = f"t-{uuid.uuid4().hex[:10]}"
        core = client.CoreV1Api(api)
        await core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
        try:
            async for running in world_of(
                world_kube,
                namespace,
                tmp_path,
                nodes=ClusterNodes(api),
                gateway_host=os.environ.get(CLUSTER_HOST_ENV, "10.87.0.1"),
            ):
                await running.start_operator()
                yield running
        finally:
            await _remove_namespace(api, namespace)
    # A client a test left unclosed is reported on this test, not at the end of the run.
    gc.collect()


@pytest.fixture
async def processless_world(emulator_kube: KubeConnection, tmp_path: Path) -> AsyncIterator[World]:
    """The operator on the emulator with one node whose pods run no process: for what
    the operator asks and does, not what the agents answer."""
    async with (
        emulator_kube.api() as api,
        Kubelet(api, local_images(), tmp_path / "kubelet", run_processes=False) as nodes,
    ):
        await nodes.add_node("node-1")
        async for running in world_of(emulator_kube, "default", tmp_path, nodes=nodes):
            await running.start_operator()
            yield running


async def _remove_namespace(api: client.ApiClient, namespace: str) -> None:
    """The operator is stopped by now: its finalizers are taken off what it left, or
    the namespace would never go; the garbage collector removes the pods."""
    raw = KubeApi(api)
    for plural in ("agentsessions", "agentmigrations"):
        for item in await raw.list(namespaced(plural, namespace)):
            if item["metadata"].get("finalizers"):
                await raw.patch(
                    namespaced(plural, namespace, item["metadata"]["name"]),
                    {"metadata": {"finalizers": None}},
                )
    await client.CoreV1Api(api).delete_namespace(namespace)
