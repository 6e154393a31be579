"""The kubelet stand-in playing KEP-5823's kubelet, checked against the KEP's text: a
``PodCheckpoint`` of one of its pods gets the status the KEP describes; one pinned to
another pod instance fails ``SourcePodReplaced``; a pod with ``restoreFrom`` runs on
the checkpoint's node as the relocated copy (a shadow, no epoch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shadowpod.kube.api import KubeApi
from shadowpod.kube.podcheckpoints import checkpoint_path, ready_condition
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.kubelet import Kubelet
from tests.kube.support import eventually
from tests.kube.test_kubelet import SERVER, container

pytestmark = pytest.mark.timeout(60)
KEP_CRD = Path(__file__).parent / "emulator" / "podcheckpoints.yaml"
GROUP_VERSION = "node.k8s.io/v1alpha1"


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    serves = container(
        "agent",
        SERVER,
        "/nonexistent",
        "/nonexistent",
        env=[
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "SHADOWPOD_MODE", "value": "owner"},
            {"name": "SHADOWPOD_EPOCH", "value": "3"},
        ],
    )
    return {"metadata": {"name": name}, "spec": {"containers": [serves], **spec}}


async def _running(api: KubeApi, name: str) -> dict[str, Any] | None:
    pod = await api.get(f"/api/v1/namespaces/default/pods/{name}")
    if pod is None or (pod.get("status") or {}).get("phase") != "Running":
        return None
    return pod


def _checkpoint(name: str, pod: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "PodCheckpoint",
        "metadata": {"name": name},
        "spec": {"sourcePod": {"name": pod, "uid": uid}, "timeoutSeconds": 10},
    }


async def test_the_stand_in_checkpoints_and_restores_as_the_kep_says(
    emulator: ApiServerEmulator, emulator_kube: KubeConnection, kubelet: Kubelet
) -> None:
    emulator.load_crds(KEP_CRD)
    taken = kubelet.serve_pod_checkpoints()
    await kubelet.add_node("node-2")
    async with emulator_kube.api() as raw:
        api = KubeApi(raw)
        await api.create("/api/v1/namespaces/default/pods", _pod("src"))
        source = await eventually(lambda: _running(api, "src"), timeout=30)
        node = source["spec"]["nodeName"]
        collection = checkpoint_path(GROUP_VERSION, "default")
        await api.create(collection, _checkpoint("wrong", "src", "not-its-uid"))
        await api.create(collection, _checkpoint("ck", "src", source["metadata"]["uid"]))

        async def final(name: str) -> dict[str, Any] | None:
            body = await api.get(checkpoint_path(GROUP_VERSION, "default", name))
            reason = (ready_condition(body or {}) or {}).get("reason")
            return body if reason not in (None, "CheckpointInProgress") else None

        wrong = await eventually(lambda: final("wrong"), timeout=30)
        assert (ready_condition(wrong) or {})["reason"] == "SourcePodReplaced"
        done = await eventually(lambda: final("ck"), timeout=30)
        condition = ready_condition(done) or {}
        assert (condition["status"], condition["reason"]) == ("True", "CheckpointCompleted")
        status = done["status"]
        assert (status["nodeName"], status["sourcePodUID"]) == (node, source["metadata"]["uid"])
        location = status["checkpointLocation"]
        assert location["type"] == "NodeLocal"
        assert location["nodeLocal"]["path"] == f"checkpoint-{done['metadata']['uid']}"
        assert status["checkpointedContainers"] == [{"name": "agent"}]
        template = status["checkpointedPodTemplate"]["spec"]
        assert "nodeName" not in template and template["containers"] == source["spec"]["containers"]
        archive = taken.root / location["nodeLocal"]["path"]
        assert archive.stat().st_mode & 0o777 == 0o700  # root's only: every memory page
        assert json.loads((archive / "checkpoint.json").read_text())["pod"]["metadata"]["name"]

        restored = {"metadata": {"name": "restored"}, "spec": {**template, "restoreFrom": "ck"}}
        await api.create("/api/v1/namespaces/default/pods", restored)
        pod = await eventually(lambda: _running(api, "restored"), timeout=30)
        assert pod["spec"]["nodeName"] == node  # pinned to the checkpoint's node
        env = await _env(pod)
        assert env["SHADOWPOD_MODE"] == "shadow" and "SHADOWPOD_EPOCH" not in env


async def _env(pod: dict[str, Any]) -> dict[str, str]:
    url = f"http://{pod['status']['podIP']}:8080/"
    async with aiohttp.ClientSession() as http:

        async def answered() -> dict[str, str] | None:
            try:
                async with http.get(url) as response:
                    found: dict[str, str] = (await response.json(content_type=None))["env"]
                    return found
            except aiohttp.ClientError:
                return None

        return await eventually(answered, timeout=30)
