"""Fixtures of the chart's tests: the emulated API server with the namespaces the chart
installs into, and real Helm on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
from kubernetes_asyncio import client

from tests.chart.helm import NAMESPACE, Helm
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator

MONITORING_CRDS = Path(__file__).parent / "crds"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[ApiServerEmulator, KubeConnection]]:
    """An API server that serves prometheus-operator's kinds, with the release's
    namespace and two namespaces of agent sessions (``team-a``, ``team-b``)."""
    async with ApiServerEmulator(crds=[MONITORING_CRDS]) as server, kmock.Server(server):
        connection = KubeConnection.to_emulator(str(server.url).rstrip("/"), tmp_path)
        async with connection.api() as api:
            core = client.CoreV1Api(api)
            for name in (NAMESPACE, "team-a", "team-b"):
                await core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
                )
        yield server, connection
    assert server.internal_errors == []


@pytest.fixture
async def helm(cluster: tuple[ApiServerEmulator, KubeConnection]) -> AsyncIterator[Helm]:
    running = await Helm.start(cluster[1].kubeconfig)
    yield running
    await running.close()
