"""Running one AgentMigration: the engine, over pods, in the operator's daemon.

- It waits its turn: in the cluster-wide pacing queue (``admission``: ``Queued``
  until admitted), and a session's migrations run one at a time, oldest first.
- Its record is made (and saved) before anything acts, with the target pod's name
  chosen once; a restarted operator finds the record and resumes the engine from
  the saved phase (``recoveries`` counts those).
- Deleting it cancels it (``cancel``, from the deletion handler, once the daemon has
  let go): before the epoch bump, the engine rolls back (the fence lifted, the shadow
  pod removed, the source untouched); after the bump there is no way back, and the
  migration finishes.
- When it ends, on success the new owner pod is labelled as the owner (the
  PodDisruptionBudget covers it) and the old pod is deleted; on failure the session
  stays on its old pod with a ``Degraded`` condition.
- The session is reconciled when the migration starts and when it ends (its status
  says so, and an image change queued behind this migration starts at once); its
  status is the session reconciler's to write, never this module's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

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
from shadowpod.engine.record import ValidationPolicy as EngineValidation
from shadowpod.gates.persona import PersonaPolicy as EnginePersona
from shadowpod.kube import (
    checkpointers,
    conditions,
    following,
    names,
    podcheckpoints,
    validation,
)
from shadowpod.kube.admission import AdmissionQueue
from shadowpod.kube.api import namespaced
from shadowpod.kube.comparisons import ClusterValidator, warm_semantic_judge
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.conditions import ConditionStatus
from shadowpod.kube.models.v1alpha1 import AgentMigration, AgentSession, MigrationCondition
from shadowpod.kube.records import MigrationRecords, timestamp
from shadowpod.kube.runtime import PodRuntime
from shadowpod.kube.sessions import (
    container_image,
    gateway_call,
    gateway_id,
    migrations_of,
    reconcile_named,
    unfinished,
)
from shadowpod.kube.strategies import choose

logger = logging.getLogger("shadowpod.operator")
TURN_POLL_S: Final = 1.0


def engine_policy(
    session: AgentSession,
    validation: EngineValidation | None = None,
    persona: EnginePersona | None = None,
) -> MigrationPolicy:
    policy = session.spec.migration
    return MigrationPolicy(
        fence_timeout_s=policy.fence_timeout_seconds,
        max_fence_attempts=policy.max_fence_attempts,
        catchup_lag_threshold=policy.catch_up_lag_threshold,
        max_duration_s=policy.max_duration_seconds,
        phase_timeout_s=policy.phase_timeout_seconds,
        drain_grace_s=policy.drain_grace_period_seconds,
        rollback_on_failure=policy.rollback_on_failure,
        validation=validation,
        persona=persona,
    )


async def run(
    ctx: OperatorContext, body: dict[str, Any], stopped: Any, queue: AdmissionQueue | None = None
) -> None:
    """Drive the AgentMigration ``body`` to its end (the daemon's whole work), then
    reconcile its session. It starts once the pacing ``queue`` admits it (Queued until
    then). Stopped (the operator exiting, the migration deleted), it leaves the record
    where it is: a restarted operator resumes it, and ``cancel`` rolls a deleted one
    back."""
    await _run(ctx, body, stopped, queue)
    session = ((body.get("spec") or {}).get("sessionRef") or {}).get("name")
    if not stopped and session:
        await reconcile_named(ctx, body["metadata"]["namespace"], session)


async def _run(
    ctx: OperatorContext, body: dict[str, Any], stopped: Any, queue: AdmissionQueue | None
) -> None:
    meta = body["metadata"]
    # Fresh: after a failed attempt, the record saved since is in the API, not in ``body``.
    body = await ctx.api.get(namespaced("agentmigrations", meta["namespace"], meta["name"])) or body
    migration = AgentMigration.model_validate(dict(body))
    if migration.status is not None and migration.status.phase in TERMINAL:
        return
    namespace = migration.metadata.namespace or "default"
    name = migration.metadata.name or ""
    session_name = migration.spec.session_ref.name
    session_body = await ctx.api.get(namespaced("agentsessions", namespace, session_name))
    labels = body["metadata"].get("labels") or {}
    if labels.get(names.SESSION_LABEL) != session_name:  # made by hand: found by its label
        path = namespaced("agentmigrations", namespace, name)
        generation = str((session_body or {}).get("metadata", {}).get("generation", ""))
        meta_patch = {
            "labels": {names.SESSION_LABEL: session_name},
            "annotations": {names.SESSION_GENERATION_ANNOTATION: generation},
        }
        body = await ctx.api.patch(path, {"metadata": meta_patch}) or body
    records = MigrationRecords(ctx, dict(body), session_body or dict(body))
    if session_body is None:
        if records.stored() is None:
            message = f"AgentSession {session_name!r} does not exist"
            await _refuse(ctx, records, body, "SessionNotFound", message)
        return
    if records.stored() is None:
        if queue is not None and not await queue.wait_turn(body, stopped):
            return
        while not await _my_turn(ctx, namespace, session_name, name):
            if stopped:
                return
            await asyncio.sleep(TURN_POLL_S)
        # The session as it is now: the wait may have been long.
        session_body = await ctx.api.get(namespaced("agentsessions", namespace, session_name))
        if session_body is None:
            return
    session = await following.effective(ctx, session_body)
    async with ctx.lock(f"migration/{namespace}/{name}"):
        record = records.stored()
        if record is None:
            try:
                record = await _new_record(ctx, session, migration)
            except validation.InvalidValidationPolicy as exc:
                await _refuse(ctx, records, body, exc.reason, str(exc))
                return
            if record is None:
                message = f"AgentSession {session_name!r} has no owner pod yet"
                await _refuse(ctx, records, body, "NoOwner", message)
                return
        elif record.done:
            return
        else:
            record = record.model_copy(update={"recoveries": record.recoveries + 1})
        await reconcile_named(ctx, namespace, session_name)  # now it says Migrating
        engine = await _engine(ctx, session, migration, records, record)
        task = asyncio.create_task(_run_engine(engine, record))
        stop_waiter = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait({task, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_waiter.cancel()
        if not task.done():
            # Stopped: like a crash, at any point; the saved record says where it was.
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        record = task.result()
    await _finish(ctx, session, records, record)


async def cancel(ctx: OperatorContext, body: dict[str, Any]) -> None:
    """A deleted AgentMigration: roll it back if the epoch has not moved yet, else
    finish it (after the bump, finishing is the only safe way out)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    async with ctx.lock(f"migration/{namespace}/{name}"):
        fresh = await ctx.api.get(namespaced("agentmigrations", namespace, name)) or body
        migration = AgentMigration.model_validate(fresh)
        session_name = migration.spec.session_ref.name
        session_body = await ctx.api.get(namespaced("agentsessions", namespace, session_name))
        records = MigrationRecords(ctx, fresh, session_body or fresh)
        record = records.stored()
        if record is None or record.done:
            return
        if session_body is None:  # the session went first: its pods go with it
            return
        session = await following.effective(ctx, session_body)
        if record.phase not in COMMITTED_PHASES and record.phase is not Phase.ROLLING_BACK:
            record = record.enter(
                Phase.ROLLING_BACK,
                failed_phase=record.phase,
                reason="Cancelled",
                error="the AgentMigration was deleted: rolled back; the source kept serving",
            )
        engine = await _engine(ctx, session, migration, records, record)
        record = await _run_engine(engine, record)
        await _finish(ctx, session, records, record)
    # While the migration is still there to be listed (its finalizer holds it): the
    # session's lastMigration says how it ended.
    await reconcile_named(ctx, namespace, session_name)


async def _engine(
    ctx: OperatorContext,
    session: AgentSession,
    migration: AgentMigration,
    records: MigrationRecords,
    record: MigrationRecord,
) -> MigrationEngine:
    runtime = PodRuntime(
        ctx, session, migration=migration.metadata.name, node=migration.spec.target.node_name
    )
    await runtime.learn_source(record.spec.source.name)
    checkpointer = None
    if ctx.config.criu:
        name = migration.metadata.name or ""
        checkpointer = checkpointers.ClusterCheckpointer(
            ctx,
            session,
            runtime,
            mechanism=await checkpointers.chosen(ctx, session.metadata.namespace or "", name),
            migration=name,
            node=migration.spec.target.node_name,
        )
    validator = None
    gates = record.spec.policy
    if gates.validation is not None or gates.persona is not None:
        validator = ClusterValidator(
            ctx,
            records.migration,
            session=session.metadata.name or "",
            source_image=record.spec.source.image,
            target_image=record.spec.target.image,
            policy=validation.policy_of(session, migration, image_changes=True),
        )
        judges: set[str] = {gates.persona.judge} if gates.persona is not None else set()
        if gates.validation is not None:
            judges.add(gates.validation.gate.judge)
        if "semantic" in judges:
            warm_semantic_judge()
    return MigrationEngine(
        runtime, ctx.control, records, checkpointer=checkpointer, validator=validator
    )


async def _run_engine(engine: MigrationEngine, record: MigrationRecord) -> MigrationRecord:
    """The engine's run, its validator's connections closed after."""
    try:
        return await engine.run(record)
    finally:
        if isinstance(engine.validator, ClusterValidator):
            await engine.validator.close()


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
    source_node = source_pod["spec"].get("nodeName")
    target_node = migration.spec.target.node_name
    choice = choose(
        migration.spec.strategy or session.spec.migration.strategy,
        source_image=source_image,
        target_image=target_image,
        criu_enabled=ctx.config.criu,
        registry=ctx.config.checkpoint_registry,
        source_node=await ctx.api.get(f"/api/v1/nodes/{source_node}") if source_node else None,
        target_node=await ctx.api.get(f"/api/v1/nodes/{target_node}") if target_node else None,
        target_node_name=target_node,
        pod_checkpoints=await podcheckpoints.served(ctx.api) if ctx.config.criu else None,
    )
    if choice.mechanism is not None:
        await ctx.api.patch(
            namespaced("agentmigrations", namespace, migration.metadata.name or ""),
            {"metadata": {"annotations": {checkpointers.MECHANISM_ANNOTATION: choice.mechanism}}},
        )
    changes = target_image != source_image
    persona = validation.persona_of(session, migration, image_changes=changes)
    policy = validation.policy_of(session, migration, image_changes=changes)
    gate = None
    if policy is not None:
        own = migration.spec.validation is not None
        field = (
            "spec.validation"
            if own
            else f"AgentSession {session.metadata.name}: spec.migration.validation"
        )
        if found := await validation.policy_problems(ctx, namespace, policy, field=field):
            raise validation.InvalidValidationPolicy(
                "; ".join(found) + ": the migration did not start; correct it and create another"
            )
        gate = validation.engine_policy(policy, namespace, field=field)
    spec = MigrationSpec(
        id=f"{namespace}/{migration.metadata.name}",
        session=gid,
        source=InstanceRef(name=ownership.owner, image=source_image),
        target=InstanceRef(
            name=names.new_instance(session.metadata.name or ""), image=target_image
        ),
        strategy=choice.engine_strategy,
        fallback=choice.fallback,
        credentials=[c.name for c in session.spec.credentials],
        policy=engine_policy(
            session, gate, None if persona is None else validation.engine_persona(persona)
        ),
        reason=migration.spec.reason,
    )
    return MigrationRecord(spec=spec, strategy_note=choice.message)


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
    session: AgentSession,
    records: MigrationRecords,
    record: MigrationRecord,
) -> None:
    namespace = session.metadata.namespace or "default"
    spec = record.spec
    if ctx.config.criu:
        await checkpointers.release(ctx, session, records.migration["metadata"]["name"], record)
    if record.phase is Phase.SUCCEEDED:
        owner_labels = {names.ROLE_LABEL: names.OWNER_ROLE, names.MIGRATION_LABEL: None}
        await ctx.api.patch(
            namespaced("pods", namespace, spec.target.name), {"metadata": {"labels": owner_labels}}
        )
        await ctx.api.delete(namespaced("pods", namespace, spec.source.name))
    elif session.spec.migration.rollback_on_failure:
        # Whatever the engine left of the shadow (rollbackOnFailure: false keeps it).
        await ctx.api.delete(namespaced("pods", namespace, spec.target.name), grace_s=0)
    logger.info(
        "migration %s ended %s",
        spec.id,
        record.phase,
        extra={"migration": spec.id, "session": spec.session},
    )
