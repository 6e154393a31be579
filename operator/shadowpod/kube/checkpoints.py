"""``KubeletCheckpointer``: the engine's ``Checkpointer`` port through the kubelet API.

- **Checkpoint**: ``POST /api/v1/nodes/{node}/proxy/checkpoint/{ns}/{pod}/{container}
  ?timeout=N`` through the API server's node proxy (RBAC: ``nodes/proxy`` create,
  the chart's ``operator.criu``). The kubelet has the node's runtime dump the agent
  container with CRIU and answers 200 ``{"items": ["/var/lib/kubelet/checkpoints/
  checkpoint-<pod>_<ns>-<container>-<timestamp>.tar"]}``. Its other answers mean the
  node cannot: 404 (the ``ContainerCheckpoint`` feature gate is off), 500 (the
  runtime does not implement checkpoints, or CRIU failed: its message says which),
  403 (the operator may not use the node proxy: ``NodeProxyForbidden``, a Warning
  event on the migration and its session saying to set the chart's ``operator.criu``)
  — each a ``CheckpointRestoreUnsupported`` saying so, which ``strategy: Auto`` answers
  by taking the app-level path and ``CRIU`` by rolling back.
- **The archive becomes an image**: the node agent (``shadowpod node-agent``, a
  DaemonSet off by default) turns each archive into a checkpoint OCI image (annotated
  ``io.kubernetes.cri-o.annotations.checkpoint.name``), pushes it to the configured
  registry as ``names.checkpoint_image(registry, archive)`` and deletes the archive.
- **Restore**: the shadow pod is the agent pod with that image, on a node labelled
  ``shadowpod.dev/checkpoint-restore=true`` (the runtime restores a container whose
  image is a checkpoint); until the image is pushed the pod waits in image pull, as
  any pod does. A target node that is not labelled, or no such node at all, is
  ``CheckpointRestoreUnsupported`` before any pod is made; a runtime that will not
  make the container (``CreateContainerError``: restore turned off) is
  ``CheckpointRestoreUnsupported`` once it says so, the pod removed.
- **Discard** (a rollback, and ``release`` once the migration has ended): the image is
  deleted from the registry (``registry.py``); a registry that will not is a Warning
  event (``CheckpointImageNotDeleted``), never a failed migration.

The watermark recorded is the agent's just before the dump: a lower bound of what
the checkpointed process holds (it catches up from its own watermark once restored).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Final

from shadowpod.engine.ports import (
    Checkpoint,
    CheckpointRestoreUnsupported,
    InstanceSpec,
    RuntimeFailure,
)
from shadowpod.kube import manifests, names
from shadowpod.kube.api import AlreadyExists, namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.credentials import give_owner_credential
from shadowpod.kube.models.v1alpha1 import AgentSession
from shadowpod.kube.registry import CheckpointImages, RegistryError
from shadowpod.kube.runtime import PodRuntime
from shadowpod.kube.strategies import CHECKPOINT_RESTORE_LABEL

RESTORED_FROM_ANNOTATION: Final = f"{names.PREFIX}/restored-from"
# How a container the runtime would not make waits (not an image still being pushed).
RESTORE_REFUSED: Final = frozenset(
    {"CreateContainerError", "CreateContainerConfigError", "RunContainerError"}
)
RESTORE_POLL_S: Final = 0.25


MECHANISM: Final = "KubeletAPI"


class NodeProxyForbidden(CheckpointRestoreUnsupported):
    """The API server refused the operator the node proxy (RBAC ``nodes/proxy``)."""

    reason = "NodeProxyForbidden"


def checkpoint_path(node: str, namespace: str, pod: str, container: str) -> str:
    return f"/api/v1/nodes/{node}/proxy/checkpoint/{namespace}/{pod}/{container}"


def _kubelet_said(body: str) -> str:
    text = body.strip()
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict) and parsed.get("message"):
            text = str(parsed["message"])
    except ValueError:
        pass
    return text[:512] or "(no body)"


class KubeletCheckpointer:
    def __init__(
        self,
        ctx: OperatorContext,
        session: AgentSession,
        runtime: PodRuntime,
        *,
        migration: str | None = None,
        node: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.session = session
        self.runtime = runtime
        self.namespace = session.metadata.namespace or "default"
        self.migration = migration
        self.node = node

    async def checkpoint(self, source: str, target: str) -> Checkpoint:
        registry = self.ctx.config.checkpoint_registry
        if registry is None:
            raise CheckpointRestoreUnsupported(
                "the operator has no --checkpoint-registry: the node agent has nowhere to"
                " push the checkpoint image"
            )
        pod = await self.ctx.api.get(namespaced("pods", self.namespace, source))
        node = None if pod is None else pod["spec"].get("nodeName")
        if pod is None or not node:
            raise RuntimeFailure(f"the source pod {source!r} is gone or not on a node")
        before = await self.runtime.status(source)
        timeout = self.ctx.config.checkpoint_timeout_s
        path = checkpoint_path(node, self.namespace, source, names.AGENT_CONTAINER)
        started = time.monotonic()
        status, body = await self.ctx.api.post_raw(path, query={"timeout": str(timeout)})
        dump_ms = (time.monotonic() - started) * 1000
        said = _kubelet_said(body)
        if status == 404:
            raise CheckpointRestoreUnsupported(
                f"the kubelet on node {node} answered 404 to the checkpoint request ({said}):"
                " its ContainerCheckpoint feature gate is off (Kubernetes < 1.30, or turned"
                " off); use the app-level state strategy, or enable the gate"
            )
        if status in (401, 403):
            refused = NodeProxyForbidden(
                f"the API server refused the operator the kubelet checkpoint API on node"
                f" {node} ({status}: {said}): it needs RBAC nodes/proxy create, which the chart"
                " grants with operator.criu=true (helm upgrade --set operator.criu=true)"
            )
            await self._warn(refused.reason, str(refused))
            raise refused
        if status >= 500:
            raise CheckpointRestoreUnsupported(
                f"the kubelet on node {node} could not checkpoint {source} ({status}: {said}):"
                " its container runtime does not implement checkpoints, or CRIU failed (on"
                " Linux >= 6.16 CRIU 4.1 cannot dump TCP sockets, criu#2718)"
            )
        if status != 200:
            raise RuntimeFailure(f"the kubelet on node {node} answered {status}: {said}")
        try:
            items = json.loads(body)["items"]
            archive = str(items[0])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise RuntimeFailure(
                f"the kubelet on node {node} answered 200 without an archive: {said}"
            ) from exc
        ref = {
            "mechanism": MECHANISM,
            "node": node,
            "archive": archive,
            "image": names.checkpoint_image(registry, archive),
        }
        return Checkpoint(
            ref=json.dumps(ref, sort_keys=True), watermark=before.watermark, dump_ms=dump_ms
        )

    async def restore(self, checkpoint: str, spec: InstanceSpec) -> None:
        ref = json.loads(checkpoint)
        path = namespaced("pods", self.namespace, spec.name)
        if await self.ctx.api.get(path) is not None:
            return  # asked again: it was created
        await self._restoring_node()
        pod = manifests.agent_pod(
            self.session,
            instance=spec.name,
            gateway_session=spec.session,
            mode="shadow",
            snapshot=spec.snapshot,
            node=self.node,
            migration=self.migration,
            image=ref["image"],
        )
        pod["metadata"]["annotations"][RESTORED_FROM_ANNOTATION] = f"{ref['node']}:{ref['archive']}"
        if self.node is None:
            pod["spec"]["nodeSelector"] = {CHECKPOINT_RESTORE_LABEL: "true"}
        await give_owner_credential(
            self.ctx.api, self.namespace, self.session.metadata.name or "", spec.session, spec.name
        )
        try:
            await self.ctx.api.create(namespaced("pods", self.namespace), pod)
        except AlreadyExists:
            return
        await self._restore_started(spec.name)

    async def _restore_started(self, name: str) -> None:
        """Wait, up to the phase timeout, until the runtime has made the container — or
        refused to: ``CheckpointRestoreUnsupported``, the pod removed. Waiting for the
        image (the node agent may still be pushing it) is not a refusal."""
        path = namespaced("pods", self.namespace, name)
        deadline = time.monotonic() + self.session.spec.migration.phase_timeout_seconds
        while time.monotonic() < deadline:
            pod = await self.ctx.api.get(path)
            if pod is None:
                return  # gone: the engine sees it and says so
            for container in (pod.get("status") or {}).get("containerStatuses", []):
                if container.get("name") != names.AGENT_CONTAINER:
                    continue
                state = container.get("state") or {}
                if "running" in state or "terminated" in state:
                    return
                waiting = state.get("waiting") or {}
                if waiting.get("reason") in RESTORE_REFUSED:
                    node = pod["spec"].get("nodeName") or "its node"
                    await self.runtime.stop(name, grace_s=0)
                    raise CheckpointRestoreUnsupported(
                        f"the runtime on {node} did not restore the checkpoint"
                        f" ({waiting['reason']}: {waiting.get('message') or 'no message'}):"
                        " restore is off by default in current CRI-O and containerd"
                        " releases (see docs/criu.md)"
                    )
            await asyncio.sleep(RESTORE_POLL_S)

    async def _restoring_node(self) -> None:
        """``CheckpointRestoreUnsupported`` unless a node can restore the shadow."""
        nodes: list[dict[str, Any]] = await self.ctx.api.list("/api/v1/nodes")
        able = [
            n
            for n in nodes
            if str((n["metadata"].get("labels") or {}).get(CHECKPOINT_RESTORE_LABEL)).lower()
            == "true"
            and not (n.get("spec") or {}).get("unschedulable")
        ]
        if self.node is not None and self.node not in {n["metadata"]["name"] for n in able}:
            raise CheckpointRestoreUnsupported(
                f"node {self.node} cannot restore a checkpoint: it is not labelled"
                f" {CHECKPOINT_RESTORE_LABEL}=true (restore is off by default in current"
                " CRI-O and containerd releases, see docs/criu.md)"
            )
        if not able:
            raise CheckpointRestoreUnsupported(
                f"no schedulable node is labelled {CHECKPOINT_RESTORE_LABEL}=true: none can"
                " restore the checkpoint"
            )

    async def discard(self, checkpoint: str) -> None:
        """Delete the checkpoint image from the registry (the archive is the node agent's,
        deleted once imaged). One the registry does not have yet is left: the node agent
        may still push it (docs/criu.md, what is left). A failure is a Warning event."""
        image = json.loads(checkpoint)["image"]
        config = self.ctx.config
        images = CheckpointImages(
            self.ctx.http,
            insecure=config.checkpoint_registry_insecure,
            authfile=config.checkpoint_registry_authfile,
        )
        try:
            await images.delete(image)
        except RegistryError as exc:
            await self._warn(
                RegistryError.reason,
                f"the checkpoint image {image} (every memory page of the agent) could not be"
                f" deleted: {exc}; delete it in the registry",
            )

    async def _warn(self, reason: str, message: str) -> None:
        """A Warning event on the migration and its session."""
        session = self.session.metadata.name or ""
        if self.migration is not None:
            await self.ctx.event_on(
                "agentmigrations", self.namespace, self.migration, "Warning", reason, message
            )
        await self.ctx.event_on(
            "agentsessions", self.namespace, session, "Warning", reason, message
        )
