"""Suspending an AgentSession and deciding when it stays suspended (issue 29).

A suspend is three steps, each safe to repeat after a crash between them:

1. a final snapshot asked of the owner (waited for a while: the journal alone would
   do, the snapshot only makes the resume quicker);
2. the gateway's suspend: an ExchangeFence to the next instance, which is *not*
   started: the owner's epoch is fenced (its writes refused), nothing is delivered,
   clients' messages wait in the journal;
3. the old owner pod deleted.

The gateway's ownership record is then ``suspended`` (or ``waking``, once a message
asked for an owner): that, not the AgentSession's status, is the truth a pass reads.
Resuming starts the instance the record names and opens delivery once it is ready
(``sessions``).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Final

from shadowpod.api.models import SuspendRequest
from shadowpod.client.gateway import GatewayError
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.kube import names
from shadowpod.kube.api import namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import (
    AgentSession,
    OperatingMode,
    SuspendReason,
    Suspension,
)
from shadowpod.kube.models.v1alpha1.session import duration_seconds

SUSPENDED: Final = frozenset({FenceState.SUSPENDED, FenceState.WAKING})
# The longest a suspend waits for the owner's final snapshot.
SNAPSHOT_WAIT_S: Final = 30.0


def is_suspended(ownership: Ownership) -> bool:
    return ownership.fence in SUSPENDED


def stays_suspended(session: AgentSession, ownership: Ownership) -> bool:
    """A suspended session stays so while its spec says Suspended, or while it sleeps
    for being idle and no message asked for it."""
    if session.spec.operating_mode is OperatingMode.SUSPENDED:
        return True
    if ownership.fence is FenceState.WAKING:
        return False
    stored = None if session.status is None else session.status.suspension
    return (
        stored is not None
        and stored.reason is SuspendReason.IDLE
        and session.spec.idle_suspend_after is not None
    )


async def due(
    ctx: OperatorContext, session: AgentSession, gid: str, pod: dict[str, Any]
) -> SuspendReason | None:
    """Why the session its ready owner ``pod`` serves should be suspended now, if it
    should. Idleness counts from the latest client message, resume, or the owner's
    readiness, whichever came last: an owner that just came up is given its time."""
    if session.spec.operating_mode is OperatingMode.SUSPENDED:
        return SuspendReason.REQUESTED
    idle_after = session.spec.idle_suspend_after
    if idle_after is None:
        return None
    activity = await ctx.admin.activity(gid)
    quiet = max(datetime.fromisoformat(activity.quiet_since), _ready_since(pod))
    quiet_s = (datetime.now(UTC) - quiet).total_seconds()
    return SuspendReason.IDLE if quiet_s >= duration_seconds(idle_after) else None


def _ready_since(pod: dict[str, Any]) -> datetime:
    for condition in (pod.get("status") or {}).get("conditions", []):
        if condition.get("type") == "Ready" and condition.get("lastTransitionTime"):
            return datetime.fromisoformat(condition["lastTransitionTime"])
    return datetime.now(UTC)


async def final_snapshot(ctx: OperatorContext, gid: str, wait_s: float) -> int | None:
    """Ask the owner for a snapshot and wait up to ``wait_s`` for it; its watermark."""
    requested = await ctx.admin.request_snapshot(gid)
    deadline = time.monotonic() + wait_s
    while True:
        latest = (await ctx.admin.status(gid)).latest_snapshot
        if latest is not None and latest >= requested:
            return latest
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.2)


async def suspend(
    ctx: OperatorContext,
    body: dict[str, Any],
    session: AgentSession,
    ownership: Ownership,
    reason: SuspendReason,
    *,
    started: bool = True,
) -> tuple[Ownership, Suspension] | None:
    """Suspend the session served by ``ownership.owner``; ``None`` when its owner did
    not end its turn within the fence timeout (the fence was lifted: the next pass tries
    again). Not ``started`` (a session created suspended): no pod of that owner was
    made, so none is asked for a snapshot or deleted — its epoch is fenced all the same,
    and the first owner starts on resume."""
    name = session.metadata.name or ""
    namespace = session.metadata.namespace or "default"
    gid = names.gateway_session(namespace, name)
    policy = session.spec.migration
    snapshot = (
        await final_snapshot(ctx, gid, min(SNAPSHOT_WAIT_S, policy.phase_timeout_seconds))
        if started
        else None
    )
    request = SuspendRequest.model_validate(
        {
            "expect_epoch": ownership.epoch,
            "next_owner": names.new_instance(name),
            "timeout_s": min(policy.fence_timeout_seconds, 300),
            "reason": reason.value,
        }
    )
    try:
        await ctx.admin.suspend(gid, request)
    except GatewayError as exc:
        if exc.reason != "FenceTimeout":
            raise
        await ctx.event(body, "Warning", "SuspendWaiting", f"{exc}; the operator tries again")
        return None
    if started and ownership.owner is not None:
        await ctx.api.delete(
            namespaced("pods", namespace, ownership.owner),
            grace_s=policy.drain_grace_period_seconds,
        )
    kept = (
        "no snapshot in time: it resumes from the journal"
        if snapshot is None
        else (f"final snapshot at seq {snapshot}")
    )
    said = (
        f"owner {ownership.owner} fenced at epoch {ownership.epoch} and deleted ({kept})"
        if started
        else "created suspended: no owner started (the first starts on resume)"
    )
    await ctx.event(
        body, "Normal", "Suspended", f"{reason.value}: {said}; messages wait in the journal"
    )
    suspended = await ctx.admin.ownership(gid)
    return suspended, Suspension(reason=reason, since=datetime.now(UTC), epoch=ownership.epoch)
