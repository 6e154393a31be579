"""Deleting a session, and moving the sessions off a cordoned node.

Deleting an AgentSession (its finalizer): its migrations are deleted (a running one
rolls back), its epoch is fenced so that no pod of it can write again, its pods are
deleted with their grace (the agent drains its background work), and the journal
is kept or deleted as ``journalRetentionPolicy.whenDeleted`` says (``retainFor``: kept
that long, marked deleted, then deleted by the gateway; a journal forks still read is
deleted by the gateway once they are gone). A gateway that
cannot be reached is asked again ``deletion_attempts`` times; then the finalizer is
released anyway, with a Warning event saying what was left behind — a deletion
never hangs on the gateway.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import kopf

from shadowpod.api.models import OwnershipChange
from shadowpod.client.gateway import GatewayError
from shadowpod.domain.errors import ShadowpodError
from shadowpod.kube import names
from shadowpod.kube.api import namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import JournalRetention
from shadowpod.kube.models.v1alpha1.session import duration_seconds
from shadowpod.kube.sessions import gateway_id, migrations_of, reconcile_and_patch, session_model

RETRY_DELAY_S = 2.0


async def delete_session(ctx: OperatorContext, body: dict[str, Any], *, attempt: int) -> None:
    session = session_model(body)
    namespace, name = session.metadata.namespace or "default", session.metadata.name or ""
    for migration in await migrations_of(ctx, namespace, name):
        await ctx.api.delete(
            namespaced("agentmigrations", namespace, migration["metadata"]["name"])
        )
    gid = gateway_id(session)
    policy = session.spec.journal_retention_policy
    retain = policy.when_deleted is JournalRetention.RETAIN
    try:
        ownership = await ctx.admin.ownership(gid)
        if ownership.epoch > 0:
            # Fenced: a pod of this session that is still running can write nothing more.
            # A new AgentSession of the same name (retention Retain) starts this instance.
            change = OwnershipChange(
                expect_epoch=ownership.epoch,
                epoch=ownership.epoch + 1,
                owner=names.new_instance(name),
            )
            await ctx.admin.set_ownership(gid, change)
        if not retain:
            await _delete_now(ctx, gid)
        elif policy.retain_for is not None:
            # Kept, marked deleted: the gateway deletes it when the period is over.
            await ctx.admin.delete_session(gid, keep_for_s=duration_seconds(policy.retain_for))
        left = None
    except GatewayError as exc:
        left = None if exc.status == 404 else f"{exc.reason}: {exc.message}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        left = f"the gateway did not answer: {str(exc) or type(exc).__name__}"
    if left is not None and attempt + 1 < ctx.config.deletion_attempts:
        raise kopf.TemporaryError(
            f"{left}; asking again ({attempt + 1}/{ctx.config.deletion_attempts})",
            delay=RETRY_DELAY_S,
        )
    for pod in await ctx.api.list(
        namespaced("pods", namespace), labels=names.session_selector(name)
    ):
        grace = session.spec.migration.drain_grace_period_seconds
        await ctx.api.delete(namespaced("pods", namespace, pod["metadata"]["name"]), grace_s=grace)
    if left is not None:
        kept = "its journal and snapshots" if not retain else "its epoch unfenced"
        await ctx.event(
            body,
            "Warning",
            "GatewayUnreachable",
            f"the session was deleted without the gateway ({left}): {kept} remain in the"
            f" gateway as session {gid!r}; delete it there with the control API",
        )


async def _delete_now(ctx: OperatorContext, gid: str) -> None:
    """Delete the session's journal; one its forks still read is marked deleted instead,
    and the gateway deletes it once they are gone."""
    try:
        await ctx.admin.delete_session(gid)
    except GatewayError as exc:
        if exc.reason != "SessionHasForks":
            raise
        await ctx.admin.delete_session(gid, keep_for_s=0)


async def reconcile_sessions_on(ctx: OperatorContext, node: str) -> None:
    """Reconcile every session whose owner runs on ``node`` (it moves them off)."""
    for namespace in ctx.config.namespaces or (None,):
        path = (
            f"/apis/{names.PREFIX}/v1alpha1/agentsessions"
            if namespace is None
            else namespaced("agentsessions", namespace)
        )
        for body in await ctx.api.list(path):
            if (body.get("status") or {}).get("nodeName") == node:
                try:
                    await reconcile_and_patch(ctx, body)
                except ShadowpodError:
                    continue
