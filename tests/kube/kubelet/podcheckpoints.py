"""KEP-5823 on the kubelet stand-in: ``PodCheckpoint`` taken, ``restoreFrom`` honoured.

As the KEP's kubelet does (keps/sig-node/5823-pod-level-checkpoint-restore, "Checkpoint
Handling" and "Restore Mechanism"):

- it acts on each ``PodCheckpoint`` whose ``spec.sourcePod.name`` is a pod on one of
  its nodes and whose ``Ready`` condition is not final: ``SourcePodReplaced`` when the
  pod's uid is not ``spec.sourcePod.uid``; else ``CheckpointInProgress``, then
  ``CheckpointCompleted`` with ``nodeName``, ``sourcePodUID``, ``checkpointLocation``
  (``NodeLocal``, ``checkpoint-<uid>``), ``completionTime``, ``checkpointedPodTemplate``
  (the pod's labels, annotations and spec without ``nodeName``) and
  ``checkpointedContainers`` — or ``CheckpointFailed`` with the runtime's error on a
  node of ``Kubelet.pod_checkpoint_failures``. The "archive" is the pod's manifest and
  the agent's ``/v1/status`` at that moment, in a 0700 directory of the node.
- a pod with ``spec.restoreFrom`` is bound to the checkpoint's node (what the API
  server's admission pins it to) once the checkpoint is Ready, and its containers run
  as the restored copy does once it has relocated: a shadow (``SHADOWPOD_MODE=shadow``,
  no epoch) that catches up from the journal. No process memory is carried: CRIU does
  not run here. A node of ``Kubelet.pod_restore_refusals`` refuses, leaving the pod
  Pending with ``Restoring=False`` and its reason, as a kubelet whose runtime fails
  ``RestorePod``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import aiohttp

from tests.kube.emulator.store import now
from tests.kube.kubelet import api as raw

if TYPE_CHECKING:
    from tests.kube.kubelet.kubelet import Kubelet

GROUP_VERSION: Final = "node.k8s.io/v1alpha1"
FINAL: Final = frozenset({"CheckpointCompleted", "CheckpointFailed", "SourcePodReplaced"})
POLL_S: Final = 0.2


def ready(body: dict[str, Any]) -> dict[str, Any]:
    for condition in (body.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            found: dict[str, Any] = condition
            return found
    return {}


async def checkpoint_node(kubelet: Kubelet, namespace: str, name: str) -> str | None:
    """The node holding a Ready PodCheckpoint's data; ``None`` until it is Ready."""
    found = await raw.call(
        kubelet.api, "GET", f"/apis/{GROUP_VERSION}/namespaces/{namespace}/podcheckpoints/{name}"
    )
    if not found or found.get("kind") == "Status" or ready(found).get("status") != "True":
        return None
    node = (found.get("status") or {}).get("nodeName")
    return None if node is None else str(node)


def restored_environment(env: dict[str, str]) -> dict[str, str]:
    """The restored copy as it is once relocated: a shadow, with no epoch of its own."""
    restored = {key: value for key, value in env.items() if key != "SHADOWPOD_EPOCH"}
    restored["SHADOWPOD_MODE"] = "shadow"
    return restored


class PodCheckpoints:
    """The loop that takes the checkpoints of the kubelet's pods."""

    def __init__(self, kubelet: Kubelet, root: Path) -> None:
        self.kubelet = kubelet
        self.root = root  # the nodes' /var/lib/kubelet/pod-checkpoints, one for all here
        self.taken: list[str] = []  # names of the PodCheckpoints completed
        self.templates: dict[str, dict[str, Any]] = {}  # their checkpointedPodTemplate

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                with contextlib.suppress(Exception):  # the API may be busy; asked again
                    await self._pass(http)
                await asyncio.sleep(POLL_S)

    async def _pass(self, http: aiohttp.ClientSession) -> None:
        listed = await raw.call(self.kubelet.api, "GET", f"/apis/{GROUP_VERSION}/podcheckpoints")
        for body in (listed or {}).get("items") or []:
            if ready(body).get("reason") in FINAL or ready(body).get("status") == "True":
                continue
            namespace = body["metadata"]["namespace"]
            source = body["spec"]["sourcePod"]
            pod = self.kubelet.pods.get((namespace, source["name"]))
            node = (pod or {}).get("spec", {}).get("nodeName")
            if pod is None or node not in self.kubelet.nodes:
                continue  # another kubelet's, or no such pod: not acted on
            await self._take(http, body, pod, node)

    async def _take(
        self, http: aiohttp.ClientSession, body: dict[str, Any], pod: dict[str, Any], node: str
    ) -> None:
        meta = body["metadata"]
        uid = pod["metadata"]["uid"]
        status: dict[str, Any] = {"nodeName": node, "sourcePodUID": uid}
        pinned = body["spec"]["sourcePod"].get("uid")
        failure = self.kubelet.pod_checkpoint_failures.get(node)
        if pinned is not None and pinned != uid:
            outcome = ("False", "SourcePodReplaced", f"pod {pod['metadata']['name']} is {uid}")
        elif failure is not None:
            outcome = ("False", "CheckpointFailed", failure)
        else:
            await self._status(meta, status, ("False", "CheckpointInProgress", ""))
            directory = self.root / f"checkpoint-{meta['uid']}"
            directory.mkdir(mode=0o700, parents=True)
            agent = await self._agent_status(http, pod)
            archive = {"pod": pod, "agent": agent}
            (directory / "checkpoint.json").write_text(json.dumps(archive))
            spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
            status.update(
                checkpointLocation={"type": "NodeLocal", "nodeLocal": {"path": directory.name}},
                completionTime=now(),
                checkpointedPodTemplate={
                    "metadata": {
                        "labels": pod["metadata"].get("labels") or {},
                        "annotations": pod["metadata"].get("annotations") or {},
                    },
                    "spec": spec,
                },
                checkpointedContainers=[{"name": c["name"]} for c in spec["containers"]],
            )
            outcome = ("True", "CheckpointCompleted", "checkpoint archive written successfully")
            self.taken.append(meta["name"])
            self.templates[meta["name"]] = status["checkpointedPodTemplate"]
        await self._status(meta, status, outcome)

    async def _agent_status(self, http: aiohttp.ClientSession, pod: dict[str, Any]) -> Any:
        ip = (pod.get("status") or {}).get("podIP")
        try:
            async with http.get(f"http://{ip}:8080/v1/status") as response:
                return await response.json(content_type=None)
        except (aiohttp.ClientError, ValueError):
            return None

    async def _status(
        self, meta: dict[str, Any], status: dict[str, Any], outcome: tuple[str, str, str]
    ) -> None:
        state, reason, message = outcome
        condition = {
            "type": "Ready",
            "status": state,
            "reason": reason,
            "message": message,
            "observedGeneration": meta.get("generation", 1),
            "lastTransitionTime": now(),
        }
        path = f"/apis/{GROUP_VERSION}/namespaces/{meta['namespace']}/podcheckpoints/{meta['name']}"
        await raw.call(
            self.kubelet.api,
            "PATCH",
            f"{path}/status",
            body={"status": {**status, "conditions": [condition]}},
            content_type=raw.MERGE,
        )
