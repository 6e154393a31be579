"""``Kubelet``: the kubelet of one or more emulated nodes, and the scheduler.

- binds pending pods to Ready, schedulable nodes (``spec.unschedulable`` is a cordon;
  ``nodeName`` and ``nodeSelector`` are honoured), spreading them;
- runs each container's command as a local process of its pod, on the pod's own
  127.x.y.z address (``status.podIP``), with its environment and volume files
  (``containers.py``); images name commands through a local image map;
- reports pod status: phase, conditions, podIP, containerStatuses with exit codes and
  the termination message; readiness probes (httpGet, tcpSocket, exec) drive Ready;
- restarts containers as ``restartPolicy`` says, and kills a container's whole process
  tree when its main process dies;
- honours graceful deletion: SIGTERM, the grace period, SIGKILL, then the pod goes;
- ``lose_node``: a node and its pods vanish at once (processes killed, Node deleted).

``docker=DockerContainers()`` is the container mode: each container runs as a Docker
container of its image (``docker.py``: host network, read-only root, user 65532, no
capabilities, the pod's environment and files), every one of them removed when its pod
goes and when the kubelet stops.

``run_processes=False`` is the "no process" mode: pods become Running and Ready at once
and nothing runs (for benchmarks of many sessions). Cordon and drain go through the
API only (``nodes.py``), so they work on a real cluster as well.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from shadowpod.local.images import ImageMap
from shadowpod.local.orphans import process_children
from tests.kube.emulator.selectors import LabelSelector
from tests.kube.emulator.store import now
from tests.kube.kubelet import api as raw
from tests.kube.kubelet.docker import DockerContainers
from tests.kube.kubelet.podcheckpoints import PodCheckpoints, checkpoint_node
from tests.kube.kubelet.pods import PodWorker, stop

TREE_TTL = 0.25  # seconds a read of the host's process tree serves every pod

PodKey = tuple[str, str]


class Kubelet:
    def __init__(
        self,
        api: client.ApiClient,
        images: ImageMap,
        workdir: Path,
        *,
        run_processes: bool = True,
        docker: DockerContainers | None = None,
    ) -> None:
        self.api = api
        self.images = images  # unused in container mode: Docker has the images
        self.workdir = workdir
        self.run_processes = run_processes
        self.docker = docker
        self.nodes: dict[str, str] = {}  # node name -> its host address
        # Nodes whose runtime refuses to restore a checkpoint image, with the runtime's
        # error (as CRI-O's checkpoint-only default): such a container stays waiting
        # in CreateContainerError. Checkpoint images are named ``…/checkpoint:…``.
        self.restore_refusals: dict[str, str] = {}
        # KEP-5823 (``serve_pod_checkpoints``): nodes whose runtime fails CheckpointPod,
        # with its error; nodes whose runtime fails RestorePod, with the reason and
        # message of the pod's Restoring=False condition.
        self.pod_checkpoint_failures: dict[str, str] = {}
        self.pod_restore_refusals: dict[str, tuple[str, str]] = {}
        self.pod_checkpoints: PodCheckpoints | None = None
        # Pods carrying one of these labels (key: value) wait in ContainerCreating until
        # it is taken out again: a test holds a migration in a phase so, deterministically.
        self.held: dict[str, str] = {}
        self.pods: dict[PodKey, dict[str, Any]] = {}  # every pod in the cluster, as watched
        self.node_objects: dict[str, dict[str, Any]] = {}
        self.workers: dict[str, PodWorker] = {}  # by pod uid
        self.cache: dict[tuple[str, str, str], dict[str, Any] | None] = {}
        base = random.randrange(1, 255)
        self._addresses = itertools.cycle(
            f"127.{base}.{b}.{c}" for b in range(4, 256) for c in range(2, 255)
        )
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._tree: tuple[float, dict[int, list[int]]] = (float("-inf"), {})

    # --- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Kubelet:
        if self.docker is not None:
            await self.docker.remove_orphans()
        listed = await raw.call(self.api, "GET", "/api/v1/pods")
        self.pods = {self._key(pod): pod for pod in listed["items"]}
        nodes = await raw.call(self.api, "GET", "/api/v1/nodes")
        self.node_objects = {node["metadata"]["name"]: node for node in nodes["items"]}
        self._tasks = [
            asyncio.create_task(self._watch("/api/v1/pods", listed, self.pods, self._key)),
            asyncio.create_task(
                self._watch(
                    "/api/v1/nodes", nodes, self.node_objects, lambda node: node["metadata"]["name"]
                )
            ),
            asyncio.create_task(self._reconcile_forever()),
        ]
        return self

    async def __aexit__(self, *_: object) -> None:
        for task in self._tasks:
            await stop(task)
        try:
            for worker in list(self.workers.values()):
                await worker.kill()
        finally:
            if self.docker is not None:
                await self.docker.remove_all()

    async def add_node(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        address = next(self._addresses)
        self.nodes[name] = address
        await raw.call(
            self.api,
            "POST",
            "/api/v1/nodes",
            body={
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                },
                "spec": {},
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": now(),
                            "lastTransitionTime": now(),
                        }
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": address},
                        {"type": "Hostname", "address": name},
                    ],
                },
            },
        )
        self._wake.set()

    def serve_pod_checkpoints(self) -> PodCheckpoints:
        """Act on KEP-5823's PodCheckpoints (the API server must serve them) and restore
        pods from them (``podcheckpoints.py``)."""
        if self.pod_checkpoints is None:
            self.pod_checkpoints = PodCheckpoints(self, self.workdir / "pod-checkpoints")
            self._tasks.append(asyncio.create_task(self.pod_checkpoints.run()))
        return self.pod_checkpoints

    async def lose_node(self, name: str) -> None:
        """The node is gone at once: its pods' processes die, its Node object goes."""
        self.nodes.pop(name, None)
        for uid, worker in list(self.workers.items()):
            if worker.node == name:
                await worker.kill()
                del self.workers[uid]
        await raw.call(self.api, "DELETE", f"/api/v1/nodes/{name}")

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        pod = self.pods.get((namespace, name))
        return None if pod is None else self.workers.get(pod["metadata"]["uid"])

    def process_children(self) -> dict[int, list[int]]:
        """The host's process tree, read from /proc at most every ``TREE_TTL`` seconds:
        every pod's worker asks each tick, and fifty pods each reading every process's
        stat file ten times a second would take the whole event loop."""
        now_ = asyncio.get_running_loop().time()
        if now_ - self._tree[0] >= TREE_TTL:
            self._tree = (now_, process_children())
        return self._tree[1]

    def next_address(self) -> str:
        in_use = {worker.ip for worker in self.workers.values()}
        while (address := next(self._addresses)) in in_use:
            pass
        return address

    async def lookup(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            found: dict[str, Any] = await raw.call(
                self.api, "GET", f"/api/v1/namespaces/{namespace}/{plural}/{name}"
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    # --- watching -----------------------------------------------------------------------

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> PodKey:
        return (pod["metadata"]["namespace"], pod["metadata"]["name"])

    async def _watch(
        self, path: str, listed: Mapping[str, Any], into: dict[Any, Any], key: Any
    ) -> None:
        version = listed["metadata"]["resourceVersion"]
        while True:
            try:
                async for event in raw.watch(
                    self.api,
                    path,
                    {
                        "resourceVersion": version,
                        "allowWatchBookmarks": "true",
                        "timeoutSeconds": "60",
                    },
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        fresh = await raw.call(self.api, "GET", path)
                        into.clear()
                        into.update({key(item): item for item in fresh["items"]})
                        version = fresh["metadata"]["resourceVersion"]
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        into.pop(key(obj), None)
                    elif event["type"] != "BOOKMARK":
                        into[key(obj)] = obj
                    self._wake.set()
            except (TimeoutError, OSError):
                await asyncio.sleep(0.5)

    async def _reconcile_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.5)
            self._wake.clear()
            await self._reconcile()

    async def _reconcile(self) -> None:
        live_uids = set()
        # Pods a node has, counted once a pass (counting them for each pod to schedule
        # made a pass over 1,000 new pods a million steps, and pods came up slowly).
        loads = collections.Counter(
            (pod.get("spec") or {}).get("nodeName") for pod in self.pods.values()
        )
        for pod in list(self.pods.values()):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            live_uids.add(meta["uid"])
            node = spec.get("nodeName")
            if not node:
                if not meta.get("deletionTimestamp"):
                    await self._schedule(pod, loads)
                continue
            if node not in self.nodes:
                continue
            worker = self.workers.get(meta["uid"])
            if worker is None:
                if (pod.get("status") or {}).get("phase") in (
                    "Succeeded",
                    "Failed",
                ) and not meta.get("deletionTimestamp"):
                    continue
                worker = PodWorker(self, pod, node)
                self.workers[meta["uid"]] = worker
                worker.start()
            worker.update(pod)
        for uid in set(self.workers) - live_uids:
            worker = self.workers.pop(uid)
            await worker.kill()  # deleted by force (grace 0) while it still ran

    # --- scheduling ---------------------------------------------------------------------

    async def _schedule(self, pod: dict[str, Any], loads: collections.Counter[str | None]) -> None:
        spec = pod.get("spec") or {}
        if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
            return
        wanted = LabelSelector.from_object({"matchLabels": spec.get("nodeSelector") or {}})
        pinned = None
        if spec.get("restoreFrom"):
            # The API server's admission pins a restore to the checkpoint's node (KEP-5823).
            pinned = await checkpoint_node(self, pod["metadata"]["namespace"], spec["restoreFrom"])
            if pinned is None:
                return  # not Ready yet: the pod waits
        candidates = []
        for name, node in self.node_objects.items():
            if pinned is not None and name != pinned:
                continue
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or []
            )
            schedulable = not (node.get("spec") or {}).get("unschedulable")
            if ready and schedulable and wanted.matches(node["metadata"].get("labels")):
                candidates.append((loads[name], name))
        namespace, name = self._key(pod)
        if not candidates:
            message = (
                f"0/{len(self.node_objects)} nodes are available: no node is Ready, "
                "schedulable and matching the pod's node selector"
            )
            conditions = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": now(),
                }
            ]
            if (pod.get("status") or {}).get("conditions") != conditions:
                old = (pod.get("status") or {}).get("conditions") or []
                if [c.get("message") for c in old] != [message]:
                    with contextlib.suppress(Exception):
                        await raw.call(
                            self.api,
                            "PATCH",
                            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                            body={"status": {"conditions": conditions}},
                            content_type=raw.MERGE,
                        )
            return
        _, chosen = min(candidates)
        loads[chosen] += 1
        with contextlib.suppress(Exception):  # a conflict: someone bound it first
            await raw.call(
                self.api,
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                body={
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name},
                    "target": {"kind": "Node", "name": chosen},
                },
            )
