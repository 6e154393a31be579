"""``PodCheckpointer``: the engine's ``Checkpointer`` port through KEP-5823's API.

KEP-5823 (pod-level checkpoint/restore, alpha in Kubernetes 1.37, feature gate
``PodLevelCheckpointRestore``) makes a checkpoint an API object: a namespaced
``PodCheckpoint`` in ``node.k8s.io/v1alpha1`` (the KEP as merged, kubernetes/
enhancements#5851; its early drafts named a ``checkpoint.k8s.io`` group, also looked
for). Where it is served the operator prefers it to the kubelet API and the node agent:

- **Detect**: API discovery (``served``): a group version listing ``podcheckpoints``.
- **Checkpoint**: create a ``PodCheckpoint`` named after the shadow pod, ``spec.
  sourcePod`` the source (name and uid: a replaced pod is never checkpointed),
  ``spec.timeoutSeconds`` the operator's ``--checkpoint-timeout``; the kubelet of the
  source's node acts on it and writes the status. Its ``Ready`` condition is the
  outcome: ``True``/``CheckpointCompleted`` (``status.nodeName``, ``status.
  checkpointLocation``, ``status.checkpointedPodTemplate``), or ``False`` with
  ``CheckpointFailed`` / ``SourcePodReplaced`` — a ``CheckpointRestoreUnsupported``
  saying so (``Auto`` falls back, ``CRIU`` rolls back).
- **Restore**: the shadow pod is created with ``spec.restoreFrom`` naming the
  checkpoint and, as the API server checks at admission, the spec the kubelet captured
  (``checkpointedPodTemplate.spec``, images by digest); its metadata is the shadow's
  (name, labels, the gateway session: the restored process re-reads its identity from
  the downward API). Admission pins it to the checkpoint's node: the alpha restores only
  there. A restore the kubelet refuses (the Pod's ``Restoring`` condition ``False`` for
  good: ``CheckpointWrongNode``, ``PodSpecMismatch``…) or the API refuses (403 without
  the ``restore`` verb, 422 a spec mismatch) is ``CheckpointRestoreUnsupported``.
- **Discard**: the ``PodCheckpoint`` is deleted when the migration ends, either way
  (its archive holds every memory page of the agent).
"""

from __future__ import annotations

import asyncio
import copy
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
from shadowpod.kube.api import AlreadyExists, KubeApi, KubeError, namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.credentials import give_owner_credential
from shadowpod.kube.models.v1alpha1 import AgentSession
from shadowpod.kube.runtime import PodRuntime

KIND: Final = "PodCheckpoint"
PLURAL: Final = "podcheckpoints"
# Where KEP-5823 serves PodCheckpoint: as merged (node.k8s.io), and as first drafted.
GROUP_VERSIONS: Final = ("node.k8s.io/v1alpha1", "checkpoint.k8s.io/v1alpha1")
MECHANISM: Final = "PodCheckpoint"
RESTORED_FROM_ANNOTATION: Final = f"{names.PREFIX}/restored-from"
# Reasons of a Ready=False PodCheckpoint that will not change (the KEP's).
FAILED: Final = frozenset({"CheckpointFailed", "SourcePodReplaced"})
# A restore Pod's Restoring=False reasons that the kubelet retries on its own.
RESTORE_RETRIED: Final = frozenset({"CheckpointNotReady", "RestoreInProgress"})
# Beyond the checkpoint's own timeout: for the kubelet to see the object and report.
PICKUP_S: Final = 30.0
POLL_S: Final = 0.25


async def served(api: KubeApi) -> str | None:
    """The group version serving ``podcheckpoints``, found by API discovery; ``None``
    where KEP-5823's API is not served (Kubernetes < 1.37, or its gate off)."""
    for group_version in GROUP_VERSIONS:
        found = await api.get(f"/apis/{group_version}")
        if found is not None and any(r.get("name") == PLURAL for r in found.get("resources") or []):
            return group_version
    return None


def checkpoint_path(group_version: str, namespace: str, name: str | None = None) -> str:
    path = f"/apis/{group_version}/namespaces/{namespace}/{PLURAL}"
    return path if name is None else f"{path}/{name}"


def ready_condition(body: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (body.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            found: dict[str, Any] = condition
            return found
    return None


class PodCheckpointer:
    def __init__(
        self,
        ctx: OperatorContext,
        session: AgentSession,
        runtime: PodRuntime,
        *,
        group_version: str,
        migration: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.session = session
        self.runtime = runtime
        self.group_version = group_version
        self.namespace = session.metadata.namespace or "default"
        self.migration = migration

    def _path(self, name: str | None = None) -> str:
        return checkpoint_path(self.group_version, self.namespace, name)

    async def checkpoint(self, source: str, target: str) -> Checkpoint:
        pod = await self.ctx.api.get(namespaced("pods", self.namespace, source))
        if pod is None or not pod["spec"].get("nodeName"):
            raise RuntimeFailure(f"the source pod {source!r} is gone or not on a node")
        before = await self.runtime.status(source)
        timeout = self.ctx.config.checkpoint_timeout_s
        labels = {**manifests.session_labels(self.session)}
        if self.migration is not None:
            labels[names.MIGRATION_LABEL] = names.label_value(self.migration)
        body = {
            "apiVersion": self.group_version,
            "kind": KIND,
            "metadata": {
                "name": target,  # one per migration: asked again, the same object
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [manifests.owner_reference(self.session)],
            },
            "spec": {
                "sourcePod": {"name": source, "uid": pod["metadata"]["uid"]},
                "timeoutSeconds": timeout,
            },
        }
        started = time.monotonic()
        try:
            await self.ctx.api.create(self._path(), body)
        except AlreadyExists:
            pass
        except KubeError as exc:
            raise CheckpointRestoreUnsupported(
                f"the API server refused the PodCheckpoint for {source} ({exc}): the operator"
                " needs podcheckpoints create, get and delete (chart: operator.criu=true)"
            ) from exc
        done = await self._finished(target, deadline=started + timeout + PICKUP_S)
        dump_ms = (time.monotonic() - started) * 1000
        status = done.get("status") or {}
        ref = {
            "mechanism": MECHANISM,
            "groupVersion": self.group_version,
            "name": target,
            "source": source,
            "node": status.get("nodeName"),
            "path": ((status.get("checkpointLocation") or {}).get("nodeLocal") or {}).get("path"),
        }
        return Checkpoint(
            ref=json.dumps(ref, sort_keys=True), watermark=before.watermark, dump_ms=dump_ms
        )

    async def _finished(self, name: str, *, deadline: float) -> dict[str, Any]:
        """The PodCheckpoint once Ready; ``CheckpointRestoreUnsupported`` once it failed,
        or when no kubelet acted on it in time."""
        while True:
            body = await self.ctx.api.get(self._path(name))
            if body is None:
                raise RuntimeFailure(f"PodCheckpoint {name} was deleted while it was taken")
            ready = ready_condition(body) or {}
            if ready.get("status") == "True":
                return body
            if ready.get("status") == "False" and ready.get("reason") in FAILED:
                source = body["spec"]["sourcePod"]["name"]
                node = (body.get("status") or {}).get("nodeName") or "its node"
                raise CheckpointRestoreUnsupported(
                    f"PodCheckpoint {name}: the kubelet on {node} could not checkpoint"
                    f" {source} ({ready['reason']}: {ready.get('message') or 'no message'}):"
                    " its container runtime does not implement CheckpointPod, or CRIU failed"
                )
            if time.monotonic() >= deadline:
                said = ready.get("reason") or "no status"
                raise CheckpointRestoreUnsupported(
                    f"PodCheckpoint {name} was not done in time ({said}): the kubelet of the"
                    " source's node does not act on PodCheckpoints (its PodLevelCheckpointRestore"
                    " feature gate is off), or the checkpoint outlasted --checkpoint-timeout"
                )
            await asyncio.sleep(POLL_S)

    async def restore(self, checkpoint: str, spec: InstanceSpec) -> None:
        ref = json.loads(checkpoint)
        path = namespaced("pods", self.namespace, spec.name)
        if await self.ctx.api.get(path) is not None:
            return  # asked again: it was created
        taken = await self.ctx.api.get(self._path(ref["name"]))
        if taken is None:
            raise RuntimeFailure(f"PodCheckpoint {ref['name']} is gone: nothing to restore")
        pod = manifests.agent_pod(
            self.session,
            instance=spec.name,
            gateway_session=spec.session,
            mode="shadow",
            migration=self.migration,
        )
        pod["metadata"]["annotations"][RESTORED_FROM_ANNOTATION] = f"{KIND}/{ref['name']}"
        pod["spec"] = await self._restore_spec(taken, ref, spec.name)
        await give_owner_credential(
            self.ctx.api, self.namespace, self.session.metadata.name or "", spec.session, spec.name
        )
        try:
            await self.ctx.api.create(namespaced("pods", self.namespace), pod)
        except AlreadyExists:
            return
        except KubeError as exc:
            raise CheckpointRestoreUnsupported(
                f"the API server refused the pod restored from PodCheckpoint {ref['name']}"
                f" ({exc}): a 403 means the operator lacks the restore verb on podcheckpoints"
                " (chart: operator.criu=true)"
            ) from exc
        await self._restore_started(spec.name, ref["name"])

    async def _restore_spec(
        self, taken: dict[str, Any], ref: dict[str, Any], instance: str
    ) -> dict[str, Any]:
        """The spec the checkpoint was taken of, as the API server compares it; with
        ``restoreFrom``. (Before the kubelet writes a template: the source pod's.)"""
        template = (taken.get("status") or {}).get("checkpointedPodTemplate") or {}
        spec = template.get("spec")
        if spec is None:
            source = await self.ctx.api.get(namespaced("pods", self.namespace, ref["source"]))
            if source is None:
                raise RuntimeFailure(f"PodCheckpoint {ref['name']} has no pod template to restore")
            spec = source["spec"]
        restored: dict[str, Any] = copy.deepcopy(spec)
        restored.pop("nodeName", None)  # admission pins it to the checkpoint's node
        restored["restoreFrom"] = ref["name"]
        _project_own_credential(restored, instance)
        return restored

    async def _restore_started(self, name: str, checkpoint: str) -> None:
        """Wait, up to the phase timeout, until the agent container runs — or the restore
        is refused for good (``CheckpointRestoreUnsupported``, the pod removed)."""
        path = namespaced("pods", self.namespace, name)
        deadline = time.monotonic() + self.session.spec.migration.phase_timeout_seconds
        while time.monotonic() < deadline:
            pod = await self.ctx.api.get(path)
            if pod is None:
                return  # gone: the engine sees it and says so
            status = pod.get("status") or {}
            for container in status.get("containerStatuses") or []:
                state = container.get("state") or {}
                if container.get("name") == names.AGENT_CONTAINER and (
                    "running" in state or "terminated" in state
                ):
                    return
            for condition in status.get("conditions") or []:
                if (
                    condition.get("type") == "Restoring"
                    and condition.get("status") == "False"
                    and condition.get("reason") not in RESTORE_RETRIED
                ):
                    node = pod["spec"].get("nodeName") or "its node"
                    await self.runtime.stop(name, grace_s=0)
                    raise CheckpointRestoreUnsupported(
                        f"the kubelet on {node} did not restore PodCheckpoint {checkpoint}"
                        f" ({condition.get('reason')}:"
                        f" {condition.get('message') or 'no message'}): its runtime may not"
                        " implement RestorePod (see docs/criu.md)"
                    )
            await asyncio.sleep(POLL_S)

    async def discard(self, checkpoint: str) -> None:
        """Delete the PodCheckpoint (a gone one is fine): its archive is every memory page
        of the agent."""
        ref = json.loads(checkpoint)
        try:
            await self.ctx.api.delete(self._path(ref["name"]))
        except KubeError as exc:
            if self.migration is not None:
                await self.ctx.event_on(
                    "agentmigrations",
                    self.namespace,
                    self.migration,
                    "Warning",
                    "PodCheckpointNotDeleted",
                    f"PodCheckpoint {ref['name']} (every memory page of the agent) could not be"
                    f" deleted: {exc}; the operator needs podcheckpoints delete"
                    " (chart: operator.criu=true), or delete it by hand",
                )


def _project_own_credential(spec: dict[str, Any], instance: str) -> None:
    """The source's spec projects the source's owner credential; the restored pod is
    another instance and must present its own (the gateway refuses a credential of
    another instance), so the projected key is this pod's."""
    for volume in spec.get("volumes") or []:
        for source in (volume.get("projected") or {}).get("sources") or []:
            for item in (source.get("secret") or {}).get("items") or []:
                if str(item.get("key", "")).startswith(names.OWNER_CREDENTIAL_PREFIX):
                    item["key"] = names.owner_credential_key(instance)
