"""Reconciling one AgentDeployment: its rollout, one planner call per pass.

Each pass reads the world fresh — the template, the sessions that name it in
``spec.deploymentRef``, their AgentMigrations, the controls (``spec.paused``, the
annotations ``rollout.shadowpod.dev/resumes`` and ``abort-revision``) — hands it with
the state stored in the status to ``fleet.planner.plan``, and acts in an order a crash
between any two steps repeats safely:

1. the status (the planner's state, progress and conditions) is written first;
2. the queued migrations the plan withdraws are deleted;
3. the migrations it starts are created, with deterministic names
   (``<session>-r<revision>-<hash of the image>``): a pass that repeats finds them made.

The migrations a rollout creates wait in the cluster-wide pacing queue (``admission``)
like any other. Events say what changed: a new revision, a halt, a pause, an abort, the
end.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from shadowpod.domain.errors import ShadowpodError
from shadowpod.fleet.followers import Follower, Move, MoveState, Outcome, Verdict
from shadowpod.fleet.planner import Plan, plan
from shadowpod.fleet.progress import RolloutPhase, conditions
from shadowpod.fleet.state import Control, RolloutState
from shadowpod.fleet.strategy import RolloutStrategy, StrategyError
from shadowpod.kube import conditions as kube_conditions
from shadowpod.kube import following, manifests, names
from shadowpod.kube.api import AlreadyExists, namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import AgentDeployment, AgentSession
from shadowpod.kube.models.v1alpha1.deployment import (
    ABORT_ANNOTATION,
    DEPLOYMENT_LABEL,
    RESUME_ANNOTATION,
    REVISION_LABEL,
    AgentDeploymentStatus,
    DeploymentCondition,
)

logger = logging.getLogger("shadowpod.operator")

REASON: Final = "Rollout"
FINISHED: Final = frozenset({"Succeeded", "RolledBack", "Failed"})
# The events a change of phase posts: (type, reason).
_PHASE_EVENTS: Final = {
    RolloutPhase.PAUSED: ("Normal", "RolloutPaused"),
    RolloutPhase.HALTED: ("Warning", "RolloutHalted"),
    RolloutPhase.ABORTING: ("Warning", "RolloutAborting"),
    RolloutPhase.ABORTED: ("Normal", "RolloutAborted"),
    RolloutPhase.COMPLETE: ("Normal", "RolloutComplete"),
    RolloutPhase.PROGRESSING: ("Normal", "RolloutProgressing"),
}


def migration_name(session: str, revision: int, image: str, attempt: int = 0) -> str:
    """One per session, revision, target image and attempt: a repeated pass finds it
    made; the move back of an abort (another image) is another, and so is a retry after
    a resume (an inconclusive gate)."""
    digest = hashlib.sha256(image.encode()).hexdigest()[:6]
    return f"{session}-r{revision}-{digest}" + (f"-{attempt}" if attempt else "")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def control_of(deployment: AgentDeployment) -> Control:
    annotations = deployment.metadata.annotations or {}
    return Control(
        paused=deployment.spec.paused,
        resumes=max(0, _int(annotations.get(RESUME_ANNOTATION)) or 0),
        abort_revision=_int(annotations.get(ABORT_ANNOTATION)),
    )


def _time(value: Any) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _revision(migration: dict[str, Any], deployment: str) -> int | None:
    labels = migration["metadata"].get("labels") or {}
    if labels.get(DEPLOYMENT_LABEL) != deployment:
        return None
    return _int(labels.get(REVISION_LABEL))


def _outcome(migration: dict[str, Any], deployment: str, version: str) -> Outcome:
    status = migration.get("status") or {}
    started = _time(status.get("startTime"))
    finished = _time(status.get("completionTime")) or started or 0.0
    failed: dict[str, Any] = next(
        (c for c in status.get("conditions", []) if c.get("type") == "Failed"),
        {},
    )
    verdict = None
    if (gate := status.get("validation")) is not None:
        verdict = Verdict(
            passed=bool(gate.get("passed")),
            judge=str(gate.get("judge", "")),
            agreement=None
            if gate.get("agreementPercent") is None
            else gate["agreementPercent"] / 100,
            message=str(gate.get("message") or ""),
            inconclusive=not gate.get("compared")
            and all(g.get("passed") for g in gate.get("goldens") or []),
        )
    return Outcome(
        migration=migration["metadata"]["name"],
        target=((migration.get("spec") or {}).get("target") or {}).get("image") or version,
        succeeded=status.get("result") == "Succeeded",
        finished_at=finished,
        duration_seconds=max(0.0, finished - (started or finished)),
        revision=_revision(migration, deployment),
        reason=None if status.get("result") == "Succeeded" else failed.get("reason"),
        message=str(status.get("message") or "")[:2048],
        verdict=verdict,
    )


def follower_of(
    session: dict[str, Any], migrations: list[dict[str, Any]], deployment: str, new_version: str
) -> Follower:
    """What the planner needs of one following session (``migrations``: its own, oldest
    first)."""
    spec = session.get("spec") or {}
    status = session.get("status") or {}
    version = status.get("image") or spec.get("image") or new_version
    move = None
    last = None
    for migration in migrations:
        phase = (migration.get("status") or {}).get("phase")
        if phase in FINISHED:
            outcome = _outcome(migration, deployment, version)
            if last is None or outcome.finished_at >= last.finished_at:
                last = outcome
        elif move is None and not migration["metadata"].get("deletionTimestamp"):
            target = ((migration.get("spec") or {}).get("target") or {}).get("image") or version
            move = Move(
                migration=migration["metadata"]["name"],
                target=target,
                state=MoveState.QUEUED if phase in (None, "Queued") else MoveState.RUNNING,
                revision=_revision(migration, deployment),
            )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    return Follower(
        name=session["metadata"]["name"],
        version=version,
        node=status.get("nodeName"),
        # A session with its own image is moved by its own image changes, not rollouts.
        pinned=bool(spec.get("pinned")) or bool(spec.get("image")),
        serving=ready,
        suspended=status.get("phase") == "Suspended",
        move=move,
        last=last,
    )


async def observe(
    ctx: OperatorContext, deployment: AgentDeployment, new_version: str
) -> tuple[list[Follower], dict[str, dict[str, Any]]]:
    """The following sessions as the planner sees them, and their bodies by name."""
    namespace = deployment.metadata.namespace or "default"
    name = deployment.metadata.name or ""
    sessions = [
        s
        for s in await ctx.api.list(namespaced("agentsessions", namespace))
        if ((s.get("spec") or {}).get("deploymentRef") or {}).get("name") == name
        and not s["metadata"].get("deletionTimestamp")
    ]
    following = {s["metadata"]["name"] for s in sessions}
    by_session: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for migration in await ctx.api.list(namespaced("agentmigrations", namespace)):
        session = str(((migration.get("spec") or {}).get("sessionRef") or {}).get("name"))
        if session in following:
            by_session[session].append(migration)
    followers = []
    for session in sorted(sessions, key=lambda s: s["metadata"]["name"]):
        own = sorted(
            by_session[session["metadata"]["name"]],
            key=lambda m: (m["metadata"].get("creationTimestamp", ""), m["metadata"]["name"]),
        )
        followers.append(follower_of(session, own, name, new_version))
    return followers, {s["metadata"]["name"]: s for s in sessions}


def status_of(
    body: dict[str, Any], result: Plan, strategy: RolloutStrategy
) -> AgentDeploymentStatus:
    generation = body["metadata"].get("generation")
    old = [
        DeploymentCondition.model_validate(c)
        for c in (body.get("status") or {}).get("conditions", [])
    ]
    conds = old
    for value in conditions(result.progress, result.state, strategy.pace.max_unavailable):
        conds = kube_conditions.set_condition(
            conds,
            DeploymentCondition,
            value.type,
            value.status,
            value.reason,
            value.message or value.reason,
            generation=generation,
        )
    return AgentDeploymentStatus.of(result.state, result.progress, conds, generation)


def _status_patch(status: AgentDeploymentStatus) -> dict[str, Any]:
    patch = status.model_dump(mode="json", by_alias=True)
    patch["conditions"] = [
        c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in status.conditions
    ]
    return {"status": patch}


async def reconcile(ctx: OperatorContext, body: dict[str, Any]) -> Plan | None:
    """One pass over the AgentDeployment ``body`` (see the module's docstring)."""
    deployment = AgentDeployment.model_validate(dict(body))
    namespace = deployment.metadata.namespace or "default"
    name = deployment.metadata.name or ""
    path = namespaced("agentdeployments", namespace, name)
    try:
        strategy = deployment.spec.strategy.to_strategy()
    except StrategyError as exc:
        await _refuse(ctx, body, exc)
        return None
    stored = deployment.status
    state = stored.rollout_state() if stored is not None else RolloutState()
    target = deployment.spec.template.image
    followers, sessions = await observe(ctx, deployment, following.new_session_image(deployment))
    result = plan(target, followers, strategy, state, control_of(deployment), time.time())
    status = status_of(body, result, strategy)
    await ctx.api.patch(f"{path}/status", _status_patch(status))
    await _say(ctx, body, stored, result)
    for migration in result.cancel:
        await ctx.api.delete(namespaced("agentmigrations", namespace, migration))
    made = 0
    for start in result.start:
        session = AgentSession.model_validate(sessions[start.session])
        manifest = manifests.agent_migration(
            session,
            name=migration_name(start.session, start.revision, start.target, start.attempt),
            reason=REASON,
            image=start.target,
        )
        manifest["metadata"]["labels"][DEPLOYMENT_LABEL] = names.label_value(name)
        manifest["metadata"]["labels"][REVISION_LABEL] = str(start.revision)
        try:
            await ctx.api.create(namespaced("agentmigrations", namespace), manifest)
        except AlreadyExists:
            continue
        made += 1
        direction = "Abort" if result.state.aborted else "Rollout"
        ctx.metrics.rollout_migrations.labels(direction=direction).inc()
    if made:
        sessions_named = ", ".join(s.session for s in result.start[:5])
        more = "…" if len(result.start) > 5 else ""
        await ctx.event(
            body,
            "Normal",
            "MigrationsCreated",
            f"revision {result.state.revision}: {made} sessions queued to move to"
            f" {result.start[0].target} ({sessions_named}{more})",
        )
    return result


async def _say(
    ctx: OperatorContext,
    body: dict[str, Any],
    stored: AgentDeploymentStatus | None,
    result: Plan,
) -> None:
    """Events for what changed since the stored status: a new revision, a new phase."""
    state, progress = result.state, result.progress
    old_revision = 0 if stored is None else stored.revision
    old_phase = None if stored is None else stored.phase
    if state.revision != old_revision:
        source = state.stable or "(none)"
        await ctx.event(
            body,
            "Normal",
            "RolloutStarted",
            f"revision {state.revision}: {source} → {state.target},"
            f" {progress.steps} steps ({progress.step_description} first)",
        )
    if progress.phase != old_phase or state.revision != old_revision:
        kind, reason = _PHASE_EVENTS[progress.phase]
        if kind == "Warning":
            await ctx.event(body, "Warning", reason, progress.message)
        else:
            await ctx.event(body, "Normal", reason, progress.message)


async def _refuse(ctx: OperatorContext, body: dict[str, Any], exc: StrategyError) -> None:
    """A strategy the API server admitted but the planner cannot follow: Progressing
    False with the reason, and a Warning event; nothing moves until it is corrected."""
    generation = body["metadata"].get("generation")
    old = [
        DeploymentCondition.model_validate(c)
        for c in (body.get("status") or {}).get("conditions", [])
    ]
    conds = kube_conditions.set_condition(
        old,
        DeploymentCondition,
        "Progressing",
        "False",
        exc.reason,
        str(exc),
        generation=generation,
    )
    conds = kube_conditions.with_defaults(
        conds,
        DeploymentCondition,
        [
            ("Available", "Unknown", "NotObserved", "the rollout waits for a valid strategy"),
            ("Halted", "False", "WithinFailureBudget", "nothing moved"),
        ],
        generation=generation,
    )
    meta = body["metadata"]
    await ctx.api.patch(
        f"{namespaced('agentdeployments', meta['namespace'], meta['name'])}/status",
        {
            "status": {
                "observedGeneration": generation,
                "message": str(exc),
                "conditions": [
                    c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conds
                ],
            }
        },
    )
    said: dict[str, Any] = next(
        (
            c
            for c in (body.get("status") or {}).get("conditions", [])
            if c.get("type") == "Progressing"
        ),
        {},
    )
    if said.get("reason") != exc.reason or said.get("message") != str(exc):
        await ctx.event(body, "Warning", exc.reason, str(exc))


async def reconcile_named(ctx: OperatorContext, namespace: str, name: str) -> None:
    """``reconcile`` of the AgentDeployment ``name``, read first (gone: nothing), one
    pass at a time per deployment; a pass that fails is said and tried at the next.
    Asked while a pass already waits its turn, it leaves it to that one: every session's
    change can ask without a fleet's worth of passes queueing up.

    A waiting pass that is cancelled (its caller stopped: a session's timer ends when
    the session becomes steady, and cancels the pass it was running) gives the turn
    back: else every later ask — events, the AgentDeployment's own timer — would fold
    into a pass that never runs, and the rollout would stand still where it was."""
    key = (namespace, name)
    if key in ctx.rollout_passes_due:
        return
    ctx.rollout_passes_due.add(key)
    running = False
    try:
        async with ctx.lock(f"deployment/{namespace}/{name}"):
            running = True
            ctx.rollout_passes_due.discard(key)
            await _pass(ctx, namespace, name)
    finally:
        if not running:
            ctx.rollout_passes_due.discard(key)


async def _pass(ctx: OperatorContext, namespace: str, name: str) -> None:
    """One pass, its turn taken."""
    body = await ctx.api.get(namespaced("agentdeployments", namespace, name))
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    try:
        result = await reconcile(ctx, body)
    except (ShadowpodError, ValidationError) as exc:
        await ctx.reconcile_failed(body, "AgentDeployment", exc)
        return
    if result is not None:
        ctx.rollout_phases[(namespace, name)] = result.progress.phase.value
    for phase in RolloutPhase:
        count = sum(1 for p in ctx.rollout_phases.values() if p == phase.value)
        ctx.metrics.rollouts.labels(phase=phase.value).set(count)


def forget(ctx: OperatorContext, namespace: str, name: str) -> None:
    """A deleted AgentDeployment: out of the rollout gauge (its sessions stay as they are)."""
    ctx.rollout_phases.pop((namespace, name), None)
    for phase in RolloutPhase:
        count = sum(1 for p in ctx.rollout_phases.values() if p == phase.value)
        ctx.metrics.rollouts.labels(phase=phase.value).set(count)
