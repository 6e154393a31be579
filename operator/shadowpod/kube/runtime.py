"""``PodRuntime``: the engine's ``Runtime`` port over pods of one AgentSession.

An instance is a pod named after it (``restartPolicy: Never``: one instance, one
epoch). Its status is the pod's: not yet running → ``starting``; running → what the
agent itself reports on ``http://POD_IP:8080/v1/status``; terminated → ``failed``
(exit code > 0, with the termination message the agent wrote), ``stopped`` (0) or
``crashed`` (killed by a signal, or the pod gone: a node lost, a deletion) — the
cases the engine tells apart to recover or to fail.

Images cannot be asked what they read before they run: ``describe`` knows an image
once one of its pods has reported (every agent reports the state schema it writes
and those it reads), and otherwise assumes the target reads the source's schema. A
target that cannot exits at once saying ``SchemaTooNew``, which the engine reports as
``IncompatibleStateSchema`` and rolls back.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Final

from shadowpod.client.agent import instance_status, read_agent_status
from shadowpod.engine.ports import (
    ImageInfo,
    ImageNotFound,
    InstanceSpec,
    InstanceStatus,
    RuntimeFailure,
)
from shadowpod.kube import manifests, names
from shadowpod.kube.api import AlreadyExists, namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.credentials import give_owner_credential
from shadowpod.kube.models.v1alpha1 import AgentSession

# An image reference as a container runtime parses it: [registry/]path[:tag][@digest].
IMAGE_REFERENCE: Final = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
# Exit codes above this are 128 + the signal that ended the container.
SIGNALLED: Final = 128
# A container waiting for one of these will not run without a change: its image is
# no reference, is not on the node under pull policy Never, or failed to pull and the
# kubelet backs off (a first ``ErrImagePull`` alone may be a registry's hiccup).
UNPULLABLE: Final = frozenset({"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
# The engine polls an instance's status every 10-50 ms; the pod behind it changes at
# the kubelet's pace (its status updates take a second or more). So a pod is read
# from the API server at most this often, the agent's own status (on the pod's IP,
# not the API server) each time: on a real API server, 100 moves at once polling
# their pods at the engine's pace were 2,000+ GETs a second, and every read
# timed out (issue 23).
POD_REFRESH_S: Final = 0.5


class NodeNotFound(RuntimeFailure):
    reason = "NodeNotFound"


def image_problem(image: str) -> str | None:
    """Why ``image`` is not a reference a container runtime can pull, if it is not."""
    if IMAGE_REFERENCE.match(image):
        return None
    return (
        f"image {image!r} is not a valid image reference ([registry/]name[:tag][@digest],"
        " lower-case): correct spec.image"
    )


class PodRuntime:
    def __init__(
        self,
        ctx: OperatorContext,
        session: AgentSession,
        *,
        migration: str | None = None,
        node: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.session = session
        self.namespace = session.metadata.namespace or "default"
        self.migration = migration
        self.node = node
        self.source_info: ImageInfo | None = None
        # Each pod's last read: (monotonic time, the pod or None when it was gone).
        self._read: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def _pod_now(self, name: str) -> dict[str, Any] | None:
        """The pod ``name``, read again once ``POD_REFRESH_S`` has passed since the
        last read (a start or a stop reads it again at once)."""
        now = asyncio.get_running_loop().time()
        read = self._read.get(name)
        if read is not None and now - read[0] < POD_REFRESH_S:
            return read[1]
        pod = await self.ctx.api.get(self._pod(name))
        self._read[name] = (now, pod)
        return pod

    def _pod(self, name: str | None = None) -> str:
        return namespaced("pods", self.namespace, name)

    async def describe(self, image: str) -> ImageInfo:
        if (problem := image_problem(image)) is not None:
            raise ImageNotFound(problem)
        if image in self.ctx.known_images:
            return self.ctx.known_images[image]
        # Not run yet: assume it reads what the source writes; its shadow will say if not.
        schema = 1 if self.source_info is None else self.source_info.state_schema
        return ImageInfo(image=image, state_schema=schema, reads_state_schemas=[schema])

    async def learn_source(self, pod_name: str) -> ImageInfo | None:
        """What the image of the source pod ``pod_name`` writes and reads, from its agent."""
        pod = await self.ctx.api.get(self._pod(pod_name))
        if pod is None or not (ip := pod.get("status", {}).get("podIP")):
            return None
        status = await read_agent_status(self.ctx.http, f"http://{ip}:{names.AGENT_PORT}")
        if status is None:
            return None
        image = _container(pod)["image"]
        info = ImageInfo(
            image=image,
            state_schema=status.state_schema,
            reads_state_schemas=sorted(set(status.reads_state_schemas)),
        )
        self.ctx.known_images[image] = self.source_info = info
        return info

    async def missing_credentials(self, image: str, names_: list[str]) -> list[str]:
        declared = {c.name: c.secret_ref for c in self.session.spec.credentials}
        missing = []
        for name in names_:
            ref = declared.get(name)
            secret = (
                None
                if ref is None
                else await self.ctx.api.get(namespaced("secrets", self.namespace, ref.name))
            )
            if secret is None or (
                ref is not None and ref.key and ref.key not in secret.get("data", {})
            ):
                missing.append(name)
        return missing

    async def start(self, spec: InstanceSpec) -> None:
        self._read.pop(spec.name, None)
        if self.node is not None and await self._node_missing(self.node):
            raise NodeNotFound(
                f"node {self.node!r} does not exist: the pod of {spec.name!r} could never"
                " be scheduled (name an existing node in spec.target.nodeName)"
            )
        existing = await self.ctx.api.get(self._pod(spec.name))
        if existing is not None:
            if _container(existing)["image"] != spec.image:
                raise RuntimeFailure(
                    f"pod {spec.name!r} exists with image {_container(existing)['image']!r},"
                    f" not {spec.image!r}"
                )
            return  # asked again: it was created
        pod = manifests.agent_pod(
            self.session,
            instance=spec.name,
            gateway_session=spec.session,
            mode=spec.mode,
            epoch=spec.epoch,
            snapshot=spec.snapshot,
            node=self.node,
            migration=self.migration,
            image=spec.image,
        )
        await give_owner_credential(
            self.ctx.api, self.namespace, self.session.metadata.name or "", spec.session, spec.name
        )
        try:
            await self.ctx.api.create(self._pod(), pod)
        except AlreadyExists:
            return

    async def status(self, name: str) -> InstanceStatus:
        pod = await self._pod_now(name)
        if pod is None:
            return InstanceStatus(name=name, alive=False, mode="crashed", error="the pod is gone")
        terminated = _terminated(pod)
        if terminated is not None:
            return terminated
        ip = pod.get("status", {}).get("podIP")
        if pod.get("status", {}).get("phase") != "Running" or not ip:
            return await self._never_starting(pod) or InstanceStatus(
                name=name, alive=True, mode="starting"
            )
        reported = await read_agent_status(self.ctx.http, f"http://{ip}:{names.AGENT_PORT}")
        if reported is not None:
            self.ctx.known_images.setdefault(
                _container(pod)["image"],
                ImageInfo(
                    image=_container(pod)["image"],
                    state_schema=reported.state_schema,
                    reads_state_schemas=sorted(set(reported.reads_state_schemas)),
                ),
            )
        return instance_status(name, reported)

    async def _node_missing(self, node: str) -> bool:
        return await self.ctx.api.get(f"/api/v1/nodes/{node}") is None

    async def _never_starting(self, pod: dict[str, Any]) -> InstanceStatus | None:
        """A pod that waits for what will not come: an image that cannot be pulled, or
        a node that does not exist (the pod pinned to it, unschedulable). Said as the
        instance failed, with the reason, rather than left ``starting`` until the
        phase times out."""
        name, status = pod["metadata"]["name"], pod.get("status", {})
        for container in status.get("containerStatuses", []):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in UNPULLABLE:
                return InstanceStatus(
                    name=name,
                    alive=False,
                    mode="failed",
                    reason="ImagePullFailed",
                    error=f"image {container.get('image')!r} cannot be pulled"
                    f" ({waiting['reason']}: {waiting.get('message') or 'no detail'}):"
                    " push it, or correct the image",
                )
        node = (pod["spec"].get("nodeSelector") or {}).get(HOSTNAME_LABEL)
        unschedulable = any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in status.get("conditions") or []
        )
        if node is not None and unschedulable and await self._node_missing(node):
            return InstanceStatus(
                name=name,
                alive=False,
                mode="failed",
                reason="NodeNotFound",
                error=f"node {node!r} does not exist: the pod cannot be scheduled",
            )
        return None

    async def stop(self, name: str, *, grace_s: float) -> None:
        """Delete the pod with ``grace_s`` (SIGTERM, then SIGKILL), and wait until it is gone."""
        self._read.pop(name, None)
        deleted = await self.ctx.api.delete(self._pod(name), grace_s=int(grace_s))
        if not deleted:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s + manifests.EXIT_MARGIN_S + 30
        while loop.time() < deadline:
            if await self.ctx.api.get(self._pod(name)) is None:
                return
            await asyncio.sleep(0.25)


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod["spec"]["containers"]
    return next((c for c in containers if c["name"] == names.AGENT_CONTAINER), containers[0])


def _terminated(pod: dict[str, Any]) -> InstanceStatus | None:
    """How the pod's agent ended, if it did (or the pod is going away)."""
    name = pod["metadata"]["name"]
    status = pod.get("status", {})
    for container in status.get("containerStatuses", []):
        if container.get("name") != names.AGENT_CONTAINER:
            continue
        ended = container.get("state", {}).get("terminated")
        if ended is None:
            break
        code = int(ended.get("exitCode", 0))
        message = (ended.get("message") or "").strip()
        how = f"exited with code {code}" + (f": {message}" if message else "")
        if code == 0:
            return InstanceStatus(name=name, alive=False, mode="stopped", error=how)
        if code > SIGNALLED or ended.get("reason") == "OOMKilled":
            return InstanceStatus(name=name, alive=False, mode="crashed", error=how)
        return InstanceStatus(name=name, alive=False, mode="failed", error=how)
    if status.get("phase") in ("Failed", "Succeeded"):
        mode = "stopped" if status["phase"] == "Succeeded" else "crashed"
        reason = status.get("reason") or status["phase"]
        return InstanceStatus(name=name, alive=False, mode=mode, error=f"the pod {reason}")
    if pod["metadata"].get("deletionTimestamp") and status.get("phase") != "Running":
        return InstanceStatus(name=name, alive=False, mode="crashed", error="the pod is deleted")
    return None
