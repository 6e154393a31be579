"""The kubelet fixture with real processes: pods run, report and stop as on a node."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.connection import KubeConnection
from tests.kube.kubelet import Kubelet
from tests.kube.nodes import cordon, drain
from tests.kube.support import eventually

# Serves, on its pod's IP, what it sees: its environment and its mounted files.
SERVER = textwrap.dedent("""
    import json, os, sys, http.server
    ip = os.environ["POD_IP"]
    def files(root):
        found = {}
        for path, _, names in os.walk(root):
            for name in names:
                if not name.startswith("."):
                    full = os.path.join(path, name)
                    found[os.path.relpath(full, root)] = open(full).read()
        return found
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"env": dict(os.environ), "secret": files(sys.argv[1]),
                               "identity": files(sys.argv[2]), "ip": ip}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *args): pass
    http.server.HTTPServer((ip, 8080), Handler).serve_forever()
""")


def container(name: str, code: str, *args: str, **extra: Any) -> dict[str, Any]:
    """A container of the ``python:local`` image running ``code`` with ``args``."""
    return {"name": name, "image": "python:local", "args": ["-c", code, *args], **extra}


async def make_pod(
    api: client.ApiClient, name: str, containers: list[dict[str, Any]], **spec: Any
) -> None:
    await client.CoreV1Api(api).create_namespaced_pod(
        "default",
        {
            "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
            "spec": {"containers": containers, **spec},
        },
    )


async def read(api: client.ApiClient, name: str) -> client.V1Pod:
    return await client.CoreV1Api(api).read_namespaced_pod(name, "default")


async def is_ready(api: client.ApiClient, name: str) -> bool:
    pod = await read(api, name)
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


async def is_gone(api: client.ApiClient, name: str) -> bool:
    try:
        await read(api, name)
    except ApiException as exc:
        return exc.status == 404
    return False


@pytest.fixture
async def api(emulator_kube: KubeConnection) -> Any:
    async with emulator_kube.api() as api_client:
        yield api_client


async def test_a_pod_runs_on_its_own_address_with_its_env_secrets_and_downward_files(
    kubelet: Kubelet, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_secret(
        "default", {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret", "other": "x"}}
    )
    await make_pod(
        api,
        "agent",
        [
            container(
                "main",
                SERVER,
                "/var/run/secrets/creds",
                "/etc/identity",
                env=[
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {
                        "name": "TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
                    },
                    {"name": "LISTEN", "value": "$(POD_IP):8080"},
                ],
                volumeMounts=[
                    {"name": "creds", "mountPath": "/var/run/secrets/creds"},
                    {"name": "identity", "mountPath": "/etc/identity"},
                ],
                readinessProbe={"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
            )
        ],
        volumes=[
            {
                "name": "creds",
                "secret": {"secretName": "creds", "items": [{"key": "token", "path": "token"}]},
            },
            {
                "name": "identity",
                "downwardAPI": {
                    "items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
                    ]
                },
            },
        ],
    )

    await eventually(lambda: is_ready(api, "agent"), timeout=30)
    pod = await read(api, "agent")
    assert pod.spec.node_name == "node-1" and pod.status.phase == "Running"
    assert pod.status.pod_ip.startswith("127.") and pod.status.pod_ip != "127.0.0.1"
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{pod.status.pod_ip}:8080/") as answer,
    ):
        seen = json.loads(await answer.text())
    assert seen["ip"] == pod.status.pod_ip
    assert seen["env"]["POD_NAME"] == "agent" and seen["env"]["TOKEN"] == "s3cret"
    assert seen["env"]["LISTEN"] == f"{pod.status.pod_ip}:8080"
    assert seen["secret"] == {"token": "s3cret"}
    assert seen["identity"] == {"name": "agent", "app": "agent"}
    assert pod.status.container_statuses[0].ready is True


async def test_readiness_follows_the_probe(
    kubelet: Kubelet, api: client.ApiClient, tmp_path: Path
) -> None:
    flag = tmp_path / "ready"
    code = "import time\nwhile True: time.sleep(1)"
    await make_pod(
        api,
        "probed",
        [
            container(
                "main",
                code,
                readinessProbe={
                    "exec": {"command": ["test", "-e", str(flag)]},
                    "periodSeconds": 1,
                    "failureThreshold": 1,
                },
            )
        ],
    )
    await eventually(lambda: _phase(api, "probed", "Running"), timeout=30)
    assert not await is_ready(api, "probed")
    flag.touch()
    await eventually(lambda: is_ready(api, "probed"), timeout=30)
    flag.unlink()
    await eventually(lambda: _not_ready(api, "probed"), timeout=30)


async def _phase(api: client.ApiClient, name: str, phase: str) -> bool:
    return (await read(api, name)).status.phase == phase


async def _not_ready(api: client.ApiClient, name: str) -> bool:
    return not await is_ready(api, name)


async def test_an_exit_is_reported_with_its_code_and_termination_message(
    kubelet: Kubelet, api: client.ApiClient
) -> None:
    code = "import sys\nopen(sys.argv[1], 'w').write('out of widgets')\nsys.exit(3)"
    await make_pod(
        api, "failing", [container("main", code, "/dev/termination-log")], restartPolicy="Never"
    )
    await eventually(lambda: _phase(api, "failing", "Failed"), timeout=30)
    state = (await read(api, "failing")).status.container_statuses[0].state.terminated
    assert state.exit_code == 3 and state.reason == "Error"
    assert state.message == "out of widgets"


async def test_a_container_is_restarted_as_its_policy_says(
    kubelet: Kubelet, api: client.ApiClient
) -> None:
    await make_pod(
        api, "crashing", [container("main", "import sys; sys.exit(1)")], restartPolicy="Always"
    )

    async def restarted() -> bool:
        statuses = (await read(api, "crashing")).status.container_statuses or []
        return bool(statuses) and statuses[0].restart_count >= 2

    await eventually(restarted, timeout=30)
    last = (await read(api, "crashing")).status.container_statuses[0].last_state.terminated
    assert last.exit_code == 1


async def test_deletion_sends_sigterm_waits_for_the_grace_then_kills_and_removes(
    kubelet: Kubelet, api: client.ApiClient, tmp_path: Path
) -> None:
    marker = tmp_path / "terminated"
    polite = textwrap.dedent(f"""
        import signal, sys, time
        def bye(*_):
            open({str(marker)!r}, "w").write("SIGTERM"); sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        while True: time.sleep(0.1)
    """)
    stubborn = textwrap.dedent("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 start_new_session=True)
        print(child.pid, flush=True)
        while True: time.sleep(0.1)
    """)
    await make_pod(api, "polite", [container("main", polite)])
    await make_pod(api, "stubborn", [container("main", stubborn)], terminationGracePeriodSeconds=1)
    await eventually(lambda: _phase(api, "polite", "Running"), timeout=30)
    await eventually(lambda: _phase(api, "stubborn", "Running"), timeout=30)
    worker = kubelet.worker("default", "stubborn")
    assert worker is not None
    child = int(await eventually(lambda: worker.logs("main").strip(), timeout=30))

    core = client.CoreV1Api(api)
    await core.delete_namespaced_pod("polite", "default")
    await core.delete_namespaced_pod("stubborn", "default")

    await eventually(lambda: is_gone(api, "polite"), timeout=30)
    await eventually(lambda: is_gone(api, "stubborn"), timeout=30)
    assert marker.read_text() == "SIGTERM"
    await eventually(
        lambda: (
            not Path(f"/proc/{child}").exists()
            or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
        ),
        timeout=10,
    )


async def test_the_scheduler_skips_cordoned_nodes_and_honours_node_selectors(
    kubelet: Kubelet, api: client.ApiClient
) -> None:
    await kubelet.add_node("node-2", labels={"disk": "ssd"})
    await cordon(api, "node-1")
    sleeper = "import time; time.sleep(600)"
    await make_pod(api, "anywhere", [container("main", sleeper)])
    await make_pod(api, "wants-hdd", [container("main", sleeper)], nodeSelector={"disk": "hdd"})

    await eventually(lambda: _phase(api, "anywhere", "Running"), timeout=30)
    assert (await read(api, "anywhere")).spec.node_name == "node-2"

    async def unschedulable() -> bool:
        pod = await read(api, "wants-hdd")
        return any(
            c.type == "PodScheduled" and c.reason == "Unschedulable"
            for c in pod.status.conditions or []
        )

    await eventually(unschedulable, timeout=30)
    assert (await read(api, "wants-hdd")).spec.node_name is None


async def test_a_drain_waits_for_the_disruption_budget(
    kubelet: Kubelet, api: client.ApiClient
) -> None:
    await kubelet.add_node("node-2")
    await cordon(api, "node-2")  # so the first replica lands on node-1
    server = "import time; time.sleep(600)"
    await make_pod(api, "first", [container("main", server)], labels={"app": "agent"})
    await eventually(lambda: is_ready(api, "first"), timeout=30)
    await cordon(api, "node-2", unschedulable=False)
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default",
        {
            "metadata": {"name": "agents"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "agent"}}},
        },
    )

    draining = asyncio.create_task(drain(api, "node-1", timeout=60))
    await asyncio.sleep(1.5)  # the drain has been refused at least once by now
    assert not draining.done() and not await is_gone(api, "first")

    await make_pod(api, "second", [container("main", server)], labels={"app": "agent"})
    await eventually(lambda: is_ready(api, "second"), timeout=30)
    assert await asyncio.wait_for(draining, 60) == ["default/first"]
    assert (await read(api, "second")).spec.node_name == "node-2"


async def test_a_lost_node_takes_its_pods_and_their_processes(
    kubelet: Kubelet, api: client.ApiClient
) -> None:
    await make_pod(api, "doomed", [container("main", "import time; time.sleep(600)")])
    await eventually(lambda: _phase(api, "doomed", "Running"), timeout=30)
    worker = kubelet.worker("default", "doomed")
    assert worker is not None
    process = worker.containers["main"].process
    assert process is not None

    await kubelet.lose_node("node-1")

    assert process.returncode is not None
    await eventually(lambda: is_gone(api, "doomed"), timeout=30)


async def test_without_processes_pods_become_running_and_ready_at_once(
    emulator_kube: KubeConnection, tmp_path: Path
) -> None:
    from tests.kube.conftest import local_images

    async with (
        emulator_kube.api() as api,
        Kubelet(api, local_images(), tmp_path, run_processes=False) as kubelet,
    ):
        await kubelet.add_node("node-1")
        await make_pod(api, "idle", [{"name": "main", "image": "refagent:v1"}])
        await eventually(lambda: is_ready(api, "idle"), timeout=30)
        pod = await read(api, "idle")
        assert pod.status.phase == "Running" and pod.status.pod_ip
        assert kubelet.worker("default", "idle").containers == {}
        await client.CoreV1Api(api).delete_namespaced_pod("idle", "default")
        await eventually(lambda: is_gone(api, "idle"), timeout=30)
