"""What the end-to-end tests share: a port-forward to a Service, client load through the
gateway, and reading sessions, migrations and pods as kubectl shows them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

from e2e.cluster import Cluster
from shadowpod.client.gateway import GatewayClient
from shadowpod.kube.names import gateway_session
from shadowpod.local.load import ClientLoad, Verdict

NAMESPACE = "shadowpod-system"
SESSIONS = "e2e"
GATEWAY = "shadowpod-gateway"
OPERATOR = "shadowpod-operator"
OPERATOR_METRICS = "shadowpod-operator-metrics"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def port_forward(cluster: Cluster, service: str, port: int) -> Iterator[str]:
    """``kubectl port-forward svc/SERVICE`` (the API server, the kubelet and containerd
    carry it), as a user reaches the gateway from outside the cluster."""
    local = free_port()
    process = subprocess.Popen(
        [
            cluster.kubectl_path,
            "--kubeconfig",
            str(cluster.kubeconfig),
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
        else:
            raise AssertionError(f"kubectl port-forward svc/{service} did not listen in 30 s")
        yield f"http://127.0.0.1:{local}"
    finally:
        process.terminate()
        process.wait(10)


def get(cluster: Cluster, kind: str, name: str, namespace: str = SESSIONS) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json")
    )
    return found


def items(cluster: Cluster, kind: str, *selector: str, namespace: str = SESSIONS) -> list[Any]:
    found: list[Any] = json.loads(
        cluster.kubectl("get", kind, "-n", namespace, *selector, "-o", "json")
    )["items"]
    return found


def wait_condition(
    cluster: Cluster, resource: str, condition: str, timeout: int = 300, namespace: str = SESSIONS
) -> None:
    cluster.kubectl(
        "wait",
        "-n",
        namespace,
        f"--for=condition={condition}",
        resource,
        f"--timeout={timeout}s",
        timeout=timeout + 30,
    )


def eventually(
    what: str, check: Callable[[], Any], timeout: float = 120, interval: float = 0.5
) -> Any:
    """``check()``'s first truthy answer, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")


def owner_pod(cluster: Cluster, session: str) -> dict[str, Any]:
    pods = items(cluster, "pods", "-l", f"shadowpod.dev/session={session},shadowpod.dev/role=owner")
    running = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [pod["metadata"]["name"] for pod in pods]
    return {
        "name": running[0]["metadata"]["name"],
        "node": running[0]["spec"]["nodeName"],
        "uid": running[0]["metadata"]["uid"],
    }


def start_session(cluster: Cluster, name: str, image: str = "shadowpod-refagent:v1") -> None:
    cluster.kubectl(
        "apply",
        "-n",
        SESSIONS,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "shadowpod.dev/v1alpha1",
                "kind": "AgentSession",
                "metadata": {"name": name},
                "spec": {
                    "image": image,
                    "migration": {"evictionStrategy": "LiveMigrate"},
                },
            }
        ),
    )
    wait_condition(cluster, f"agentsession/{name}", "Ready", timeout=180)


async def under_load(
    base_url: str, session: str, action: Callable[[], Any], rate: float = 20.0
) -> ClientLoad:
    """Client load on ``session`` through the gateway while ``action`` (blocking) runs:
    5 s before it, 5 s after; every accepted message must then be answered."""
    async with GatewayClient(base_url) as client:
        load = ClientLoad(client, gateway_session(SESSIONS, session), rate)
        stop = asyncio.Event()
        watcher = asyncio.create_task(load.watch())
        sender = asyncio.create_task(load.run(stop))
        try:
            await asyncio.sleep(5)
            await asyncio.to_thread(action)
            await asyncio.sleep(5)
        finally:
            stop.set()
            await sender
        answered = await load.wait_answered(90)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        assert answered, f"not every message was answered in 90 s: {load.verdict()}"
        return load


def assert_invariants(verdict: Verdict) -> None:
    assert verdict.accepted > 0, verdict
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0), verdict
