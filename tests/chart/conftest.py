"""Fixtures of the chart's tests: the emulated API server with the namespaces the chart
installs into, and real Helm on it."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes_asyncio import client

from tests.chart.helm import NAMESPACE, Helm, Rendered
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator

MONITORING_CRDS = Path(__file__).parent / "crds"


@contextlib.asynccontextmanager
async def emulated_cluster(
    directory: Path,
) -> AsyncIterator[tuple[ApiServerEmulator, KubeConnection]]:
    """An API server that serves prometheus-operator's kinds, with the release's
    namespace and two namespaces of agent sessions (``team-a``, ``team-b``)."""
    async with ApiServerEmulator(crds=[MONITORING_CRDS]) as server, kmock.Server(server):
        connection = KubeConnection.to_emulator(str(server.url).rstrip("/"), directory)
        async with connection.api() as api:
            core = client.CoreV1Api(api)
            for name in (NAMESPACE, "team-a", "team-b"):
                await core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
                )
        yield server, connection
    assert server.internal_errors == []


async def render(values: dict[str, Any], directory: Path) -> Rendered:
    """One install on a cluster of its own, for tests that only read what Helm rendered."""
    async with emulated_cluster(directory) as (_, connection):
        helm = await Helm.start(connection.kubeconfig)
        try:
            return await helm.install(values)
        finally:
            await helm.close()


# Every optional switch on.
EVERYTHING_ON: dict[str, Any] = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    },
    "networkPolicy": {"enabled": True, "agentNamespaces": ["team-a", "team-b"]},
    "podDisruptionBudget": {"enabled": True},
    "operator": {"criu": True},
}


@pytest.fixture(scope="session")
def _defaults(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return asyncio.run(render({}, tmp_path_factory.mktemp("defaults")))


@pytest.fixture(scope="session")
def _everything_on(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return asyncio.run(render(EVERYTHING_ON, tmp_path_factory.mktemp("everything-on")))


@pytest.fixture
def defaults(_defaults: Rendered) -> Rendered:
    """The chart installed with its default values (rendered once; each test a copy)."""
    return copy.deepcopy(_defaults)


@pytest.fixture
def everything_on(_everything_on: Rendered) -> Rendered:
    """The chart installed with every switch on (rendered once; each test a copy)."""
    return copy.deepcopy(_everything_on)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[ApiServerEmulator, KubeConnection]]:
    async with emulated_cluster(tmp_path) as running:
        yield running


@pytest.fixture
async def helm(cluster: tuple[ApiServerEmulator, KubeConnection]) -> AsyncIterator[Helm]:
    running = await Helm.start(cluster[1].kubeconfig)
    yield running
    await running.close()
