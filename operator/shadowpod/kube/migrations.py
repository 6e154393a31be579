"""Running one AgentMigration: the engine, over pods, in the operator's daemon.

- It waits its turn: a session's migrations run one at a time, oldest first.
- Its record is made (and saved) before anything acts, with the target pod's name
  chosen once; a restarted operator finds the record and resumes the engine from
  the saved phase (``recoveries`` counts those).
- Deleting it cancels it: before the epoch bump, the engine rolls back (the fence
  lifted, the shadow pod removed, the source untouched); after the bump there is no
  way back, and the migration finishes.
- When it ends, the session is told: on success the new owner pod is labelled as
  the owner (the PodDisruptionBudget covers it) and the old pod is deleted; on
  failure the session stays on its old pod with a ``Degraded`` condition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import kopf

from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.record import (
    COMMITTED_PHASES,
    TERMINAL,
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    MigrationSpec,
    Phase,
)
from shadowpod.kube import conditions, names
from shadowpod.kube.api import namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.conditions import ConditionStatus
from shadowpod.kube.models.v1alpha1 import AgentMigration, AgentSession, MigrationCondition
from shadowpod.kube.records import RESULTS, MigrationRecords, seconds_time, timestamp
from shadowpod.kube.runtime import PodRuntime
from shadowpod.kube.sessions import (
    container_image,
    gateway_call,
    gateway_id,
    migrations_of,
    session_model,
    unfinished,
)

logger = logging.getLogger("shadowpod.operator")
TURN_POLL_S: Final = 1.0


class Cancelled(Exception):
    """The AgentMigration was deleted while it ran."""


def engine_policy(session: AgentSession) -> MigrationPolicy:
    policy = session.spec.migration
    return MigrationPolicy(
        fence_timeout_s=policy.fence_timeout_seconds,
        max_fence_attempts=policy.max_fence_attempts,
        catchup_lag_threshold=policy.catch_up_lag_threshold,
        max_duration_s=policy.max_duration_seconds,
        phase_timeout_s=policy.phase_timeout_seconds,
        drain_grace_s=policy.drain_grace_period_seconds,
        rollback_on_failure=policy.rollback_on_failure,
    )


async def run(ctx: OperatorContext, body: dict[str, Any], stopped: Any) -> None:
    """Drive the AgentMigration ``body`` to its end (the daemon's whole work)."""
    migration = AgentMigration.model_validate(dict(body))
    if migration.status is not None and migration.status.phase in TERMINAL:
        return
    namespace = migration.metadata.namespace or "default"
    name = migration.metadata.name or ""
    session_name = migration.spec.session_ref.name
    session_path = namespaced("agentsessions", namespace, session_name)
    session_body = await ctx.api.get(session_path)
    records = MigrationRecords(ctx, dict(body), session_body or dict(body))
    record = records.stored()
    if session_body is None and record is None:
        await _refuse(
            ctx,
            records,
            body,
            "SessionNotFound",
            f"AgentSession {session_name!r} does not exist",
        )
        return
    session = session_model(session_body) if session_body is not None else None
    if record is None:
        if session is None:
            return
        while not await _my_turn(ctx, namespace, session_name, name):
            if stopped:
                return
            await asyncio.sleep(TURN_POLL_S)
        record = await _new_record(ctx, session, migration)
        if record is None:
            await _refuse(
                ctx, records, body, "NoOwner", f"AgentSession {session_name!r} has no owner pod yet"
            )
            return
    elif not record.done:
        record = record.model_copy(update={"recoveries": record.recoveries + 1})
    if session is None:
        return
    await ctx.api.patch(
        f"{session_path}/status", {"status": {"activeMigration": name, "phase": "Migrating"}}
    )
    runtime = PodRuntime(ctx, session, migration=name, node=migration.spec.target.node_name)
    await runtime.learn_source(record.spec.source.name)
    engine = MigrationEngine(runtime, ctx.control, records)
    task = asyncio.create_task(engine.run(record))
    record = await _until_done_or_cancelled(task, stopped, records, engine)
    if record is None:
        return  # the operator is stopping: a restarted one resumes from the record
    await _finish(ctx, session_body or {}, session, records, record)


async def _until_done_or_cancelled(
    task: asyncio.Task[MigrationRecord],
    stopped: Any,
    records: MigrationRecords,
    engine: MigrationEngine,
) -> MigrationRecord | None:
    stop_waiter = asyncio.ensure_future(stopped.wait())
    try:
        done, _ = await asyncio.wait({task, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        deleted = _deleted(stopped)
        if not deleted:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        # Cancelled by deletion: roll back if the bump has not happened yet.
        current = records.stored()
        if current is not None and current.phase in COMMITTED_PHASES:
            return await task  # past the cutover: finishing is the only safe way
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        current = records.stored()
        if current is None or current.done:
            return current
        rollback = current.enter(
            Phase.ROLLING_BACK,
            failed_phase=current.phase,
            reason="Cancelled",
            error="the AgentMigration was deleted: rolled back, the source kept serving",
        )
        return await engine.run(rollback)
    finally:
        stop_waiter.cancel()


def _deleted(stopped: Any) -> bool:
    reason = getattr(stopped, "reason", None)
    return bool(reason is not None and reason & kopf.DaemonStoppingReason.RESOURCE_DELETED)


async def _my_turn(ctx: OperatorContext, namespace: str, session: str, name: str) -> bool:
    """Whether every older migration of the session has finished."""
    for other in await migrations_of(ctx, namespace, session):
        if other["metadata"]["name"] == name:
            return True
        if unfinished(other):
            return False
    return True


async def _new_record(
    ctx: OperatorContext, session: AgentSession, migration: AgentMigration
) -> MigrationRecord | None:
    namespace = session.metadata.namespace or "default"
    gid = gateway_id(session)
    ownership = await gateway_call(ctx, lambda: ctx.admin.ownership(gid))
    source_pod = await ctx.api.get(namespaced("pods", namespace, ownership.owner or ""))
    if not ownership.owner or source_pod is None:
        return None
    source_image = container_image(source_pod)
    target_image = migration.spec.target.image or source_image
    spec = MigrationSpec(
        id=f"{namespace}/{migration.metadata.name}",
        session=gid,
        source=InstanceRef(name=ownership.owner, image=source_image),
        target=InstanceRef(
            name=names.new_instance(session.metadata.name or ""), image=target_image
        ),
        credentials=[c.name for c in session.spec.credentials],
        policy=engine_policy(session),
        reason=migration.spec.reason,
    )
    return MigrationRecord(spec=spec)


async def _refuse(
    ctx: OperatorContext, records: MigrationRecords, body: dict[str, Any], reason: str, message: str
) -> None:
    """A migration that cannot start: Failed at once, saying why."""
    generation = body["metadata"].get("generation")
    conds: list[MigrationCondition] = []
    states: tuple[tuple[str, ConditionStatus], ...] = (("Succeeded", "False"), ("Failed", "True"))
    for kind, state in states:
        conds = conditions.set_condition(
            conds,
            MigrationCondition,
            kind,
            state,
            reason,
            message,
            generation=generation,
        )
    await ctx.api.patch(
        f"{records.path}/status",
        {
            "status": {
                "observedGeneration": generation,
                "phase": "Failed",
                "result": "Failed",
                "message": message,
                "completionTime": timestamp(time.time()),
                "conditions": [c.model_dump(mode="json", by_alias=True) for c in conds],
            }
        },
    )
    await ctx.event(body, "Warning", reason, message)


async def _finish(
    ctx: OperatorContext,
    session_body: dict[str, Any],
    session: AgentSession,
    records: MigrationRecords,
    record: MigrationRecord,
) -> None:
    namespace = session.metadata.namespace or "default"
    spec = record.spec
    summary: dict[str, Any] = {
        "name": records.migration["metadata"]["name"],
        "reason": record.reason or spec.reason,
        "result": RESULTS.get(record.phase),
        "sourceImage": spec.source.image,
        "targetImage": spec.target.image,
        "startTime": seconds_time(record.started),
        "completionTime": seconds_time(record.ended),
        "durationMilliseconds": None if record.total_s is None else round(record.total_s * 1000),
        "fencePauseMilliseconds": None
        if record.fence_pause_ms is None
        else round(record.fence_pause_ms),
    }
    status: dict[str, Any] = {"activeMigration": None, "lastMigration": summary}
    if record.phase is Phase.SUCCEEDED:
        owner_labels = {names.ROLE_LABEL: names.OWNER_ROLE, names.MIGRATION_LABEL: None}
        await ctx.api.patch(
            namespaced("pods", namespace, spec.target.name), {"metadata": {"labels": owner_labels}}
        )
        await ctx.api.delete(namespaced("pods", namespace, spec.source.name))
        status.update(
            ownerPod=spec.target.name,
            image=spec.target.image,
            epoch=None if record.fence is None else record.fence.epoch,
            phase="Running",
        )
    else:
        # Whatever the engine left of the shadow (rollbackOnFailure: false keeps it).
        if session.spec.migration.rollback_on_failure:
            await ctx.api.delete(namespaced("pods", namespace, spec.target.name), grace_s=0)
    session_path = namespaced("agentsessions", namespace, session.metadata.name or "")
    await ctx.api.patch(f"{session_path}/status", {"status": status})
    logger.info(
        "migration %s ended %s",
        spec.id,
        record.phase,
        extra={"migration": spec.id, "session": spec.session},
    )
