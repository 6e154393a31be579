"""From nothing to a live migration on a real cluster (kind): the chart installed, an
AgentSession of the reference agent under client load, an image bump and a node drain,
with the client-side invariants (0 lost, 0 duplicated, 0 reordered) and the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from e2e.cluster import Kind
from e2e.conftest import NAMESPACE, SESSIONS
from shadowpod.client.gateway import GatewayClient
from shadowpod.kube.names import gateway_session
from shadowpod.local.load import ClientLoad

SESSION = "demo"
GATEWAY = "shadowpod-gateway"
OPERATOR_METRICS = "shadowpod-operator-metrics"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def port_forward(kind: Kind, service: str, port: int) -> Iterator[str]:
    local = free_port()
    process = subprocess.Popen(
        [
            "kubectl",
            "--kubeconfig",
            str(kind.kubeconfig),
            "-n",
            NAMESPACE,
            "port-forward",
            f"svc/{service}",
            f"{local}:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", local), 1):
                break
            time.sleep(0.2)
        yield f"http://127.0.0.1:{local}"
    finally:
        process.terminate()
        process.wait(10)


def session(kind: Kind) -> dict[str, object]:
    found: dict[str, object] = json.loads(
        kind.kubectl("get", "agentsession", SESSION, "-n", SESSIONS, "-o", "json")
    )
    return found


def wait_for(kind: Kind, condition: str, resource: str, timeout: int = 300) -> None:
    kind.kubectl(
        "wait",
        "-n",
        SESSIONS,
        f"--for=condition={condition}",
        resource,
        f"--timeout={timeout}s",
        timeout=timeout + 30,
    )


def owner_pod(kind: Kind) -> dict[str, str]:
    pods = json.loads(
        kind.kubectl(
            "get",
            "pods",
            "-n",
            SESSIONS,
            "-l",
            f"shadowpod.dev/session={SESSION},shadowpod.dev/role=owner",
            "-o",
            "json",
        )
    )["items"]
    assert len(pods) == 1, [pod["metadata"]["name"] for pod in pods]
    return {"name": pods[0]["metadata"]["name"], "node": pods[0]["spec"]["nodeName"]}


async def under_load(base_url: str, action: object, rate: float = 20.0) -> ClientLoad:
    """Client load on the session while ``action`` (a blocking call) runs."""
    async with GatewayClient(base_url) as client:
        load = ClientLoad(client, gateway_session(SESSIONS, SESSION), rate)
        stop = asyncio.Event()
        watcher = asyncio.create_task(load.watch())
        sender = asyncio.create_task(load.run(stop))
        await asyncio.sleep(5)
        await asyncio.to_thread(action)  # type: ignore[arg-type]
        await asyncio.sleep(5)
        stop.set()
        await sender
        assert await load.wait_answered(60), "not every message was answered in 60 s"
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        return load


def assert_invariants(load: ClientLoad) -> None:
    verdict = load.verdict()
    assert verdict.accepted > 0
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0), verdict


@pytest.fixture(scope="module")
def running(installed: Kind) -> Kind:
    installed.kubectl(
        "apply",
        "-n",
        SESSIONS,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "shadowpod.dev/v1alpha1",
                "kind": "AgentSession",
                "metadata": {"name": SESSION},
                "spec": {"image": "shadowpod-refagent:v1", "imagePullPolicy": "Never"},
            }
        ),
    )
    wait_for(installed, "Ready", f"agentsession/{SESSION}")
    return installed


def test_an_image_bump_migrates_live_under_load(running: Kind) -> None:
    def bump() -> None:
        running.kubectl(
            "patch",
            "agentsession",
            SESSION,
            "-n",
            SESSIONS,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"image": "shadowpod-refagent:v2"}}),
        )
        generation = session(running)["metadata"]["generation"]  # type: ignore[index]
        wait_for(running, "Succeeded", f"agentmigration/{SESSION}-g{generation}", timeout=600)

    with port_forward(running, GATEWAY, 8800) as url:
        load = asyncio.run(under_load(url, bump))
    assert_invariants(load)
    assert load.verdict().version_switches == 1


def test_the_migration_shows_on_the_operators_metrics(running: Kind) -> None:
    import urllib.request

    with port_forward(running, OPERATOR_METRICS, 9090) as url:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    assert "shadowpod_migrations_total{reason=" in text
    assert 'result="Succeeded"' in text
    assert "shadowpod_migration_phase_duration_seconds_bucket" in text


def test_a_drained_node_moves_the_session_live(running: Kind) -> None:
    before = owner_pod(running)

    def drain() -> None:
        running.kubectl(
            "drain",
            before["node"],
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=300s",
            timeout=360,
        )

    try:
        with port_forward(running, GATEWAY, 8800) as url:
            load = asyncio.run(under_load(url, drain))
    finally:
        running.kubectl("uncordon", before["node"], check=False)
    assert_invariants(load)
    after = owner_pod(running)
    assert after["node"] != before["node"]
    assert after["name"] != before["name"]
