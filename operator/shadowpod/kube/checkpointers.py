"""Which ``Checkpointer`` a migration's CRIU path uses, and what is left once it ends.

The strategy's choice (``strategies.choose``) names a mechanism: ``PodCheckpoint``
(KEP-5823's API, where served) or ``KubeletAPI`` (the kubelet checkpoint API, the node
agent and checkpoint images). It is kept on the AgentMigration as an annotation, so
that a restarted operator checkpoints the way the status said it would, and shown as
``status.checkpointMechanism``. A checkpoint's reference names its own mechanism:
restore and discard follow it whatever was chosen.

``release``, once a migration has ended (succeeded, rolled back or failed): its
PodCheckpoint is deleted, or its checkpoint image deleted from the registry — a
rollback's engine has discarded them already, and asking again costs one request.
"""

from __future__ import annotations

import json

from shadowpod.engine.ports import Checkpoint, CheckpointRestoreUnsupported, InstanceSpec
from shadowpod.engine.record import MigrationRecord
from shadowpod.kube import podcheckpoints
from shadowpod.kube.api import namespaced
from shadowpod.kube.checkpoints import MECHANISM as KUBELET_API
from shadowpod.kube.checkpoints import KubeletCheckpointer
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import AgentSession
from shadowpod.kube.podcheckpoints import PodCheckpointer
from shadowpod.kube.records import MECHANISM_ANNOTATION
from shadowpod.kube.runtime import PodRuntime

__all__ = ["MECHANISM_ANNOTATION", "ClusterCheckpointer", "chosen", "release"]


class ClusterCheckpointer:
    """The engine's ``Checkpointer``: checkpoints with the chosen mechanism; restores and
    discards with the one the checkpoint was taken with."""

    def __init__(
        self,
        ctx: OperatorContext,
        session: AgentSession,
        runtime: PodRuntime,
        *,
        mechanism: str | None,
        migration: str | None,
        node: str | None,
    ) -> None:
        self.ctx = ctx
        self.session = session
        self.runtime = runtime
        self.mechanism = mechanism or KUBELET_API
        self.migration = migration
        self.kubelet = KubeletCheckpointer(ctx, session, runtime, migration=migration, node=node)

    def _pods(self, group_version: str) -> PodCheckpointer:
        return PodCheckpointer(
            self.ctx,
            self.session,
            self.runtime,
            group_version=group_version,
            migration=self.migration,
        )

    def _taken_by(self, checkpoint: str) -> KubeletCheckpointer | PodCheckpointer:
        ref = json.loads(checkpoint)
        if ref.get("mechanism") == podcheckpoints.MECHANISM:
            return self._pods(ref["groupVersion"])
        return self.kubelet

    async def checkpoint(self, source: str, target: str) -> Checkpoint:
        if self.mechanism != podcheckpoints.MECHANISM:
            return await self.kubelet.checkpoint(source, target)
        group_version = await podcheckpoints.served(self.ctx.api)
        if group_version is None:
            raise CheckpointRestoreUnsupported(
                "the cluster no longer serves KEP-5823's PodCheckpoint (its gate turned off"
                " since the migration started)"
            )
        return await self._pods(group_version).checkpoint(source, target)

    async def restore(self, checkpoint: str, spec: InstanceSpec) -> None:
        await self._taken_by(checkpoint).restore(checkpoint, spec)

    async def discard(self, checkpoint: str) -> None:
        await self._taken_by(checkpoint).discard(checkpoint)


async def chosen(ctx: OperatorContext, namespace: str, migration: str) -> str | None:
    """The mechanism the AgentMigration's strategy chose (its annotation)."""
    body = await ctx.api.get(namespaced("agentmigrations", namespace, migration))
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    found = annotations.get(MECHANISM_ANNOTATION)
    return None if found is None else str(found)


async def release(
    ctx: OperatorContext, session: AgentSession, migration: str, record: MigrationRecord
) -> None:
    """Delete what the migration's checkpoint left: its PodCheckpoint (named after the
    shadow pod, whether or not the engine kept its reference: a failed one too), or its
    checkpoint image."""
    namespace = session.metadata.namespace or "default"
    mechanism = await chosen(ctx, namespace, migration)
    if mechanism is None and record.checkpoint is None:
        return
    runtime = PodRuntime(ctx, session, migration=migration)
    checkpointer = ClusterCheckpointer(
        ctx, session, runtime, mechanism=mechanism, migration=migration, node=None
    )
    if record.checkpoint is not None:
        await checkpointer.discard(record.checkpoint)
    if mechanism == podcheckpoints.MECHANISM:
        group_version = await podcheckpoints.served(ctx.api)
        if group_version is not None:
            path = podcheckpoints.checkpoint_path(group_version, namespace, record.spec.target.name)
            await ctx.api.delete(path)
