"""The kubelet stand-in's container mode (tests/kube/kubelet/docker.py): a pod's
container runs as a Docker container of its image, with what a pod gives it — and no
more than a hardened pod may have."""

from __future__ import annotations

import asyncio
import json
import textwrap
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.image.docker import USER, Images
from tests.kube.connection import KubeConnection
from tests.kube.kubelet import Kubelet
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(1500)  # the first test of a run builds the image

# Serves, on its pod's IP, what it finds: its environment, its user, its mounted files
# and where it may write.
SEES = textwrap.dedent("""
    import json, os, sys, signal, http.server
    def files(root):
        found = {}
        for path, _, names in os.walk(root):
            for name in names:
                if not name.startswith("."):
                    full = os.path.join(path, name)
                    found[os.path.relpath(full, root)] = open(full).read()
        return found
    def writable(path):
        try:
            open(os.path.join(path, "probe"), "w").close()
        except OSError as exc:
            return exc.strerror
        return "yes"
    seen = {"env": dict(os.environ), "uid": os.getuid(), "gid": os.getgid(),
            "secret": files(sys.argv[1]), "identity": files(sys.argv[2]),
            "writes": {p: writable(p) for p in ("/", "/opt/shadowpod", "/tmp", "/scratch",
                                                 sys.argv[1])}}
    with open("/proc/self/status") as status:
        seen["caps"] = [l.split()[1] for l in status if l.startswith("CapEff")][0]
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(seen).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *args): pass
    server = http.server.HTTPServer((os.environ["POD_IP"], 8080), Handler)
    def stop(*_):
        open("/dev/termination-log", "w").write("stopped on SIGTERM")
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()
""")


async def make_pod(api: client.ApiClient, name: str, spec: dict[str, Any]) -> None:
    await client.CoreV1Api(api).create_namespaced_pod(
        "default", {"metadata": {"name": name, "labels": {"app": name}}, "spec": spec}
    )


async def read(api: client.ApiClient, name: str) -> client.V1Pod:
    return await client.CoreV1Api(api).read_namespaced_pod(name, "default")


async def test_a_pod_runs_in_a_hardened_container_with_its_env_and_read_only_files(
    images: Images, kube: KubeConnection, kubelet: Kubelet
) -> None:
    async with kube.api() as api:
        await client.CoreV1Api(api).create_namespaced_secret(
            "default", {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
        )
        await make_pod(
            api,
            "sees",
            {
                "containers": [
                    {
                        "name": "main",
                        "image": images.shadowpod,
                        "command": ["python3", "-c", SEES],
                        "args": ["/var/run/secrets/creds", "/etc/identity"],
                        "env": [
                            {
                                "name": "POD_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                            },
                            {
                                "name": "TOKEN",
                                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
                            },
                            {"name": "LISTEN", "value": "$(POD_IP):8080"},
                        ],
                        "volumeMounts": [
                            {"name": "creds", "mountPath": "/var/run/secrets/creds"},
                            {"name": "identity", "mountPath": "/etc/identity"},
                            {"name": "scratch", "mountPath": "/scratch"},
                        ],
                        "readinessProbe": {
                            "httpGet": {"path": "/", "port": 8080},
                            "periodSeconds": 1,
                        },
                    }
                ],
                "volumes": [
                    {"name": "creds", "secret": {"secretName": "creds"}},
                    {
                        "name": "identity",
                        "downwardAPI": {
                            "items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]
                        },
                    },
                    {"name": "scratch", "emptyDir": {}},
                ],
                "terminationGracePeriodSeconds": 30,
            },
        )

        async def ready() -> client.V1Pod | None:
            pod = await read(api, "sees")
            conditions = {c.type: c.status for c in pod.status.conditions or []}
            return pod if conditions.get("Ready") == "True" else None

        pod = await eventually(ready, timeout=60)
        ip = pod.status.pod_ip
        async with aiohttp.ClientSession() as http, http.get(f"http://{ip}:8080/") as answer:
            seen = json.loads(await answer.text())

        # The pod's environment, on top of the image's.
        assert seen["env"]["TOKEN"] == "s3cret" and seen["env"]["LISTEN"] == f"{ip}:8080"
        assert seen["env"]["PYTHONDONTWRITEBYTECODE"] == "1"  # the image's own
        # Its files, and nowhere to write but /tmp and its emptyDir: not the root, not a
        # Secret volume.
        assert seen["secret"] == {"token": "s3cret"} and seen["identity"] == {"name": "sees"}
        assert seen["writes"] == {
            "/": "Read-only file system",
            "/opt/shadowpod": "Read-only file system",
            "/tmp": "yes",
            "/scratch": "yes",
            "/var/run/secrets/creds": "Read-only file system",
        }
        # The numeric non-root user, with no capability at all.
        assert (seen["uid"], seen["gid"]) == (int(USER), int(USER))
        assert int(seen["caps"], 16) == 0
        assert pod.status.container_statuses[0].container_id.startswith("docker://")

        # Graceful deletion: SIGTERM reaches the process in the container, which
        # exits well before the grace period ends.
        loop = asyncio.get_running_loop()
        started = loop.time()
        await client.CoreV1Api(api).delete_namespaced_pod("sees", "default")

        async def gone() -> bool:
            try:
                await read(api, "sees")
            except ApiException as exc:
                return exc.status == 404
            return False

        await eventually(gone, timeout=60)
        assert loop.time() - started < 20, "SIGTERM did not stop the container"


async def test_an_exit_is_reported_and_a_missing_image_is_never_pulled(
    images: Images, kube: KubeConnection, kubelet: Kubelet
) -> None:
    code = "import sys\nopen('/dev/termination-log', 'w').write('out of widgets')\nsys.exit(3)"
    async with kube.api() as api:
        await make_pod(
            api,
            "fails",
            {
                "containers": [
                    {"name": "main", "image": images.shadowpod, "command": ["python3", "-c", code]}
                ],
                "restartPolicy": "Never",
            },
        )
        await make_pod(
            api,
            "absent",
            {"containers": [{"name": "main", "image": "shadowpod-no-such-image:v0"}]},
        )

        async def terminated() -> client.V1ContainerStateTerminated | None:
            pod = await read(api, "fails")
            statuses = pod.status.container_statuses or []
            return statuses[0].state.terminated if statuses and pod.status.phase else None

        state = await eventually(terminated, timeout=60)
        assert (state.exit_code, state.reason, state.message) == (3, "Error", "out of widgets")
        assert (await read(api, "fails")).status.phase == "Failed"

        async def waiting() -> client.V1ContainerStateWaiting | None:
            statuses = (await read(api, "absent")).status.container_statuses or []
            found = statuses[0].state.waiting if statuses else None
            return found if found and found.reason != "ContainerCreating" else None

        why = await eventually(waiting, timeout=30)
        assert why.reason == "ErrImageNeverPull"
        assert "shadowpod-no-such-image:v0" in why.message
