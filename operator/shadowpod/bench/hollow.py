"""A hollow node, for measuring the operator with thousands of sessions on a real
control plane: a Node the real scheduler places pods on, whose pods are said Running
and Ready without anything run (kubemark's hollow kubelet, in the small).

The control plane is real (kube-apiserver, etcd, the scheduler, the controllers); only
the containers are not: 10,000 agents cannot run on the benchmark's machine, and the
operator's cost at rest does not depend on them — it sees a session steady when the
owner pod is Ready. What a kubelet writes is written the same way: the Node's status
and its Lease renewed every 10 s (so the node lifecycle controller keeps it Ready),
each pod's status patched once (Running and Ready, or waiting on ``ImagePullBackOff``
for an image the node does not have, as a real kubelet says of an image no registry
has), and a pod being deleted removed at once (the kubelet's final delete).

Given ``agents`` (``bench.hollow_agents``), the node runs the agents of the Shadowpod
pods whose image it knows, in this process, each on a loopback address of its own
(the pod's IP): the pod is Running once its agent serves, Ready while the agent says
it is (its readiness probe's answer), terminated with the agent's exit code when the
agent exits, and on deletion its agent is stopped as a kubelet stops a container —
asked to stop, killed after the pod's grace period — before the pod is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any, Final

from shadowpod.bench.hollow_agents import HollowAgent, HollowAgents, exit_status
from shadowpod.bench.informer import follow
from shadowpod.engine.ports import RuntimeUnavailable
from shadowpod.kube.api import KubeApi, KubeError

LEASES: Final = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
RENEW_S: Final = 10.0
LEASE_S: Final = 40
# How often the node reads its agents' readiness (a kubelet's probe period is 1 s).
READINESS_S: Final = 0.5
START_ATTEMPTS: Final = 30
START_RETRY_S: Final = 2.0
HOLLOW_LABEL: Final = "shadowpod.dev/hollow-node"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(name: str, pods: int) -> dict[str, Any]:
    capacity = {"cpu": "1000", "memory": "4000Gi", "pods": str(pods), "ephemeral-storage": "4Ti"}
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                HOLLOW_LABEL: "true",
            },
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "hollow node: pods are said to run, nothing runs",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "hollow",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def running_status(
    pod: dict[str, Any], *, ip: str | None = None, ready: bool = True
) -> dict[str, Any]:
    """What a kubelet writes of a pod whose containers started, ready or not; its IP
    where something answers on one (a hollow agent)."""
    now = _now()
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodReadyToStartContainers", "Initialized")
    ]
    conditions += [
        {"type": kind, "status": str(ready), "lastTransitionTime": now}
        for kind in ("Ready", "ContainersReady")
    ]
    conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now})
    status: dict[str, Any] = {
        "phase": "Running",
        "startTime": now,
        "conditions": conditions,
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": ready,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod["spec"]["containers"]
        ],
    }
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return status


def unpullable_status(pod: dict[str, Any]) -> dict[str, Any]:
    """What a kubelet writes of a pod whose image no registry has."""
    now = _now()
    return {
        "phase": "Pending",
        "startTime": now,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {
                "type": "Ready",
                "status": "False",
                "reason": "ContainersNotReady",
                "lastTransitionTime": now,
            },
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{c["image"]}" (hollow node)',
                    }
                },
            }
            for c in pod["spec"]["containers"]
        ],
    }


class HollowNode:
    """``async with HollowNode(api, name, images):`` the node registered and kept
    Ready; its pods said running (``images``) or not pullable (any other image).
    ``schedules``: bind pods no scheduler binds (the emulator has no scheduler);
    ``agents``: run the agents of the Shadowpod pods whose image they know."""

    def __init__(
        self,
        api: KubeApi,
        name: str,
        images: frozenset[str],
        *,
        pods: int = 20_000,
        schedules: bool = False,
        concurrency: int = 8,
        agents: HollowAgents | None = None,
    ) -> None:
        self.api = api
        self.name = name
        self.images = images
        self.pods = pods
        self.schedules = schedules
        self.agents = agents
        self.running: dict[str, HollowAgent] = {}  # pod uid -> its agent
        self._ready: dict[str, bool] = {}  # pod uid -> readiness last said
        self._pods: dict[str, dict[str, Any]] = {}  # pod uid -> the pod, as started
        self.said: dict[str, str] = {}  # pod uid -> "Running" | "ImagePullBackOff"
        self.failures: dict[str, int] = {}
        self.breaks: dict[str, int] = {}
        self._limit = asyncio.Semaphore(concurrency)
        self._tasks: list[asyncio.Task[None]] = []
        self._work: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HollowNode:
        with contextlib.suppress(KubeError):  # left by a run stopped part way
            await self.api.delete(f"/api/v1/nodes/{self.name}", grace_s=0)
        await self.api.create("/api/v1/nodes", node_manifest(self.name, self.pods))
        await self._renew(create=True)
        self._tasks = [
            asyncio.create_task(self._keep_lease(), name=f"{self.name}-lease"),
            asyncio.create_task(
                follow(
                    self.api,
                    "/api/v1/pods",
                    self._on_pod,
                    query={"fieldSelector": f"spec.nodeName={self.name}"},
                    breaks=self.breaks,
                ),
                name=f"{self.name}-pods",
            ),
        ]
        if self.agents is not None:
            self._tasks.append(
                asyncio.create_task(self._readiness(), name=f"{self.name}-readiness")
            )
        if self.schedules:
            self._tasks.append(
                asyncio.create_task(
                    follow(
                        self.api,
                        "/api/v1/pods",
                        self._on_unscheduled,
                        query={"fieldSelector": "spec.nodeName="},
                        breaks=self.breaks,
                    ),
                    name=f"{self.name}-scheduler",
                )
            )
        return self

    async def __aexit__(self, *_: object) -> None:
        for task in [*self._tasks, *self._work]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._work, return_exceptions=True)
        for agent in list(self.running.values()):
            await agent.stop(0.0)
        self.running.clear()
        with contextlib.suppress(KubeError, RuntimeUnavailable):
            await self.api.delete(f"/api/v1/nodes/{self.name}", grace_s=0)

    async def _renew(self, *, create: bool = False) -> None:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name},
            "spec": {
                "holderIdentity": self.name,
                "leaseDurationSeconds": LEASE_S,
                "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        if create and await self.api.get(f"{LEASES}/{self.name}") is None:
            await self.api.create(LEASES, lease)
        else:
            await self.api.patch(f"{LEASES}/{self.name}", {"spec": lease["spec"]})

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                await self._renew()
            except (KubeError, RuntimeUnavailable) as exc:
                self._failed(f"lease: {type(exc).__name__}")

    def _failed(self, what: str) -> None:
        self.failures[what] = self.failures.get(what, 0) + 1

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    def _on_pod(self, kind: str, pod: dict[str, Any], _: float) -> None:
        meta = pod["metadata"]
        if kind == "DELETED":
            self.said.pop(meta["uid"], None)
            return
        if meta.get("deletionTimestamp"):
            if self.said.get(meta["uid"]) != "Removed":
                self.said[meta["uid"]] = "Removed"
                grace = float(pod["spec"].get("terminationGracePeriodSeconds") or 30)
                self._spawn(self._remove(meta["namespace"], meta["name"], meta["uid"], grace))
            return
        if meta["uid"] in self.said:
            return
        if self.agents is not None and self.agents.runs(pod):
            # Said once, started once: a status that could not be written is not a
            # reason to start the pod's agent again.
            self.said[meta["uid"]] = "Running"
            self._spawn(self._run(pod))
            return
        images = {c["image"] for c in pod["spec"]["containers"]}
        runs = images <= self.images
        self.said[meta["uid"]] = "Running" if runs else "ImagePullBackOff"
        status = running_status(pod) if runs else unpullable_status(pod)
        self._spawn(self._say(meta["namespace"], meta["name"], meta["uid"], status))

    async def _say(self, namespace: str, name: str, uid: str, status: dict[str, Any]) -> None:
        async with self._limit:
            path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
            for _ in range(5):
                try:
                    await self.api.patch(path, {"status": status})
                    return
                except RuntimeUnavailable:
                    await asyncio.sleep(2.0)
                except KubeError as exc:
                    self._failed(f"pod status: {exc.status} {exc.reason}")
                    break
            if uid not in self.running:
                self.said.pop(uid, None)  # said again at its next event

    async def _run(self, pod: dict[str, Any]) -> None:
        """The pod's agent started and said Running (not Ready until it says so); when
        it exits by itself, the pod said terminated with its exit code."""
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        assert self.agents is not None
        agent = None
        # Tried again, as a kubelet tries a container whose config it cannot read yet
        # (the session's Secret not there, the API server too busy to answer).
        for _ in range(START_ATTEMPTS):
            try:
                agent = await self.agents.start(pod)
                break
            except Exception as exc:  # noqa: BLE001 - counted, tried again
                self._failed(f"agent start: {type(exc).__name__}")
                if self.said.get(uid) == "Removed":
                    return
                await asyncio.sleep(START_RETRY_S)
        if agent is None:
            return
        if self.said.get(uid) == "Removed":  # deleted while its agent started
            await agent.stop(0.0)
            self.agents.release(agent.address)
            return
        self.running[uid], self._pods[uid], self._ready[uid] = agent, pod, False
        await self._say(namespace, name, uid, running_status(pod, ip=agent.address, ready=False))
        await asyncio.wait({agent.main})
        if self.running.pop(uid, None) is None:
            return  # stopped for the pod's deletion: it goes, nothing more to say
        self._ready.pop(uid, None)
        self._pods.pop(uid, None)
        result = 1 if agent.main.cancelled() or agent.main.exception() else agent.main.result()
        await agent.close()
        self.agents.release(agent.address)
        await self._say(namespace, name, uid, exit_status(pod, agent, result))

    async def _readiness(self) -> None:
        """Every agent's readiness, as its readiness probe would find it; said on a
        change."""
        while True:
            await asyncio.sleep(READINESS_S)
            for uid, agent in list(self.running.items()):
                ready = agent.runtime.ready
                if self._ready.get(uid) == ready or agent.main.done():
                    continue
                self._ready[uid] = ready
                pod = self._pods[uid]
                meta = pod["metadata"]
                status = running_status(pod, ip=agent.address, ready=ready)
                self._spawn(self._say(meta["namespace"], meta["name"], uid, status))

    async def _remove(self, namespace: str, name: str, uid: str, grace_s: float) -> None:
        agent = self.running.pop(uid, None)
        if agent is not None:
            self._ready.pop(uid, None)
            self._pods.pop(uid, None)
            await agent.stop(grace_s)
            assert self.agents is not None
            self.agents.release(agent.address)
        async with self._limit:
            try:
                await self.api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", grace_s=0)
            except (KubeError, RuntimeUnavailable) as exc:
                self._failed(f"pod delete: {type(exc).__name__}")

    def _on_unscheduled(self, kind: str, pod: dict[str, Any], _: float) -> None:
        if kind in ("LISTED", "ADDED") and not pod["metadata"].get("deletionTimestamp"):
            self._spawn(self._bind(pod["metadata"]["namespace"], pod["metadata"]["name"]))

    async def _bind(self, namespace: str, name: str) -> None:
        async with self._limit:
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
            }
            try:
                await self.api.create(
                    f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding
                )
            except (KubeError, RuntimeUnavailable) as exc:
                self._failed(f"binding: {type(exc).__name__}")
