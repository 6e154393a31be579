"""Reconciling one AgentSession: what must exist for it to serve, and its status.

Level-triggered: every pass reads the world fresh (the gateway's ownership is the
truth about who owns the session and at which epoch; the pods and migrations are
listed from the API) and makes what is missing, in an order that a crash between
any two steps repeats safely:

1. the spec's references checked (credential Secrets, the image reference): a
   problem is a ``Degraded`` condition and a Warning event, never a crash loop;
2. the per-session Secret with the agent token, *before* the session exists in the
   gateway (which is then created with the token's hash);
3. the session in the gateway, and its first owner recorded at epoch 1 before the
   owner pod exists, so that the pod's first write is already fenced;
4. the PodDisruptionBudget that holds ``kubectl drain`` until the session has moved;
5. the owner pod; an owner pod that died outside a migration is replaced by a new
   one at a new epoch, restoring from the latest snapshot and the journal;
6. an AgentMigration when the image changed or the owner's node is cordoned —
   one at a time: a change during a migration waits for it;
7. a suspend (``spec.operatingMode: Suspended``, or ``idleSuspendAfter`` passed with
   no client message) or a resume (``suspensions``): the gateway's ownership record
   says whether the session is suspended; a resume starts the owner it names and opens
   delivery once that pod is ready.

``reconcile_and_patch`` writes an AgentSession's status (and ``refresh_journal`` its
journal figures alone, from the gateway's positions): every pass
writes it whole from what it saw (``activeMigration`` and ``lastMigration`` from the
AgentMigrations it lists), and a pass that fails says why there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
from pydantic import ValidationError

from shadowpod.api.models import (
    CreateSession,
    CredentialSpec,
    ForkFrom,
    OwnershipChange,
    RestoreSession,
    ScheduleSpec,
)
from shadowpod.client.gateway import GatewayError
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import Ownership
from shadowpod.engine.ports import GatewayUnavailable
from shadowpod.engine.record import TERMINAL
from shadowpod.kube import conditions, following, manifests, names, suspensions, validation
from shadowpod.kube.api import AlreadyExists, namespaced
from shadowpod.kube.comparisons import warm_semantic_judge
from shadowpod.kube.context import Failure, OperatorContext, backoff_key
from shadowpod.kube.credentials import give_owner_credential, owner_key_of
from shadowpod.kube.models.conditions import ConditionStatus
from shadowpod.kube.models.v1alpha1 import (
    AgentSession,
    AgentSessionStatus,
    JournalStatus,
    Judge,
    MigrationSummary,
    OperatingMode,
    PersonaJudge,
    SessionCondition,
    SuspendReason,
    Suspension,
)
from shadowpod.kube.models.v1alpha1.policy import EvictionStrategy
from shadowpod.kube.records import summary_of
from shadowpod.kube.runtime import image_problem
from shadowpod.sessions.tokens import new_owner_key, new_token, token_hash

logger = logging.getLogger("shadowpod.operator")

FINISHED: Final = frozenset(phase.value for phase in TERMINAL)


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


def session_model(body: dict[str, Any]) -> AgentSession:
    return AgentSession.model_validate(dict(body))


def gateway_id(session: AgentSession) -> str:
    return names.gateway_session(
        session.metadata.namespace or "default", session.metadata.name or ""
    )


async def gateway_call(ctx: OperatorContext, call: Any) -> Any:
    """A call to the gateway, asked again for a while when it is away."""
    return await ctx.control.retry(call)


async def problems(ctx: OperatorContext, session: AgentSession) -> list[Problem]:
    """What in the spec the API server could not check and the operator can."""
    found = []
    namespace = session.metadata.namespace or "default"
    if session.spec.image is None:
        followed = session.spec.deployment_ref.name if session.spec.deployment_ref else ""
        found.append(
            Problem(
                "DeploymentNotFound",
                f"spec.deploymentRef names AgentDeployment {followed!r}, which"
                f" does not exist in namespace {namespace!r}: create it, or give spec.image",
            )
        )
    elif (problem := image_problem(session.spec.image)) is not None:
        found.append(Problem("InvalidImage", problem))
    for credential in session.spec.credentials:
        ref = credential.secret_ref
        secret = await ctx.api.get(namespaced("secrets", namespace, ref.name))
        if secret is None:
            found.append(
                Problem(
                    "SecretNotFound",
                    f"credential {credential.name!r} refers to Secret {ref.name!r}, which does"
                    f" not exist in namespace {namespace!r}: create it",
                )
            )
        elif ref.key is not None and ref.key not in (secret.get("data") or {}):
            found.append(
                Problem(
                    "SecretKeyNotFound",
                    f"credential {credential.name!r} refers to key {ref.key!r} of Secret"
                    f" {ref.name!r}, which has no such key: add it or correct secretRef.key",
                )
            )
    persona = session.spec.migration.persona
    if persona is not None and persona.judge is PersonaJudge.SEMANTIC:
        warm_semantic_judge()  # before a change of image needs it
    if (policy := session.spec.migration.validation) is not None:
        if policy.gate.judge is Judge.SEMANTIC:
            warm_semantic_judge()
        field = "spec.migration.validation"
        if said := await validation.policy_problems(ctx, namespace, policy, field=field):
            found.append(
                Problem(
                    validation.InvalidValidationPolicy.reason,
                    "; ".join(said) + "; an image change waits until it is corrected",
                )
            )
    return found


def _degraded_reason(body: dict[str, Any]) -> str | None:
    for condition in (body.get("status") or {}).get("conditions", []):
        if condition["type"] == "Degraded" and condition["status"] == "True":
            return str(condition["reason"])
    return None


async def migrations_of(ctx: OperatorContext, namespace: str, session: str) -> list[dict[str, Any]]:
    """The session's AgentMigrations, oldest first (by the session label, which the
    operator puts on every migration, those made by hand included)."""
    listed = await ctx.api.list(
        namespaced("agentmigrations", namespace), labels=names.session_selector(session)
    )
    mine = [m for m in listed if m["spec"]["sessionRef"]["name"] == session]
    return sorted(
        mine, key=lambda m: (m["metadata"].get("creationTimestamp", ""), m["metadata"]["name"])
    )


def unfinished(migration: dict[str, Any]) -> bool:
    phase = (migration.get("status") or {}).get("phase", "Pending")
    return phase not in FINISHED and not migration["metadata"].get("deletionTimestamp")


async def ensure_token_secret(ctx: OperatorContext, session: AgentSession) -> tuple[str, str]:
    """The agent token and the owner key, from the session's Secret (made, with a new
    token and key, if missing; a Secret made before owner keys is given one)."""
    namespace = session.metadata.namespace or "default"
    name = names.token_secret(session.metadata.name or "")
    path = namespaced("secrets", namespace, name)
    secret = await ctx.api.get(path)
    if secret is None:
        body = manifests.token_secret(
            session,
            token=new_token(),
            gateway_url=ctx.config.agent_gateway_url,
            owner_key=new_owner_key(),
        )
        try:
            secret = await ctx.api.create(namespaced("secrets", namespace), body)
        except AlreadyExists:
            secret = await ctx.api.get(path)
    if secret is not None and owner_key_of(secret) is None:
        key = base64.b64encode(new_owner_key().encode()).decode()
        secret = await ctx.api.patch(path, {"data": {names.OWNER_KEY_KEY: key}})
    if secret is None:
        raise GatewayUnavailable(f"the Secret {name} vanished while it was made")
    owner_key = owner_key_of(secret)
    assert owner_key is not None
    return base64.b64decode(secret["data"][names.TOKEN_KEY]).decode(), owner_key


# What the gateway says when a fork cannot be made as the spec asks.
FORK_REFUSALS: Final = ("SessionNotFound", "SnapshotNotFound", "InvalidForkPoint")


async def ensure_gateway_session(
    ctx: OperatorContext, session: AgentSession, token: str, owner_key: str
) -> Problem | None:
    """The session in the gateway, with the owner key: owner writes then need the
    credential of the pod the ownership record names (``kube.credentials``). A session
    the gateway already has keeps what it was made with. A fork the gateway cannot make
    (no such parent, snapshot or seq) is a problem to report, asked again later."""
    fork = session.spec.fork_from
    namespace = session.metadata.namespace or "default"
    request = CreateSession(
        session=gateway_id(session),
        meta={"namespace": session.metadata.namespace or "", "name": session.metadata.name or ""},
        credentials=[
            CredentialSpec(name=c.name, secret_ref=f"{c.secret_ref.name}/{c.secret_ref.key or ''}")
            for c in session.spec.credentials
        ],
        schedules=[
            ScheduleSpec(
                schedule_id=s.name, every_s=s.every_seconds, content=s.message, wake=s.wake
            )
            for s in session.spec.schedules
        ],
        agent_token_sha256=token_hash(token),
        owner_key=owner_key,
        fork_from=None
        if fork is None
        else ForkFrom(
            session=names.gateway_session(namespace, fork.session),
            seq=fork.seq,
            snapshot=fork.snapshot,
        ),
    )
    try:
        await gateway_call(ctx, lambda: ctx.admin.create_session(request))
    except GatewayError as exc:
        if fork is not None and exc.reason in FORK_REFUSALS:
            return Problem(
                "ForkRefused",
                f"cannot fork AgentSession {fork.session!r}: {exc.message}; correct"
                " spec.forkFrom (it is asked again)",
            )
        if exc.reason != "SessionExists":
            raise
        # Kept after an AgentSession of this name was deleted, and created again: in use
        # again (no longer swept), by agents holding this AgentSession's token and key.
        again = RestoreSession(agent_token_sha256=token_hash(token), owner_key=owner_key)
        await gateway_call(ctx, lambda: ctx.admin.restore_session(request.session, again))
    keep = session.spec.checkpoint.retain_snapshots
    await gateway_call(ctx, lambda: ctx.admin.set_retention(request.session, keep))
    return None


async def ensure_budget(ctx: OperatorContext, session: AgentSession) -> None:
    namespace = session.metadata.namespace or "default"
    path = namespaced(
        "poddisruptionbudgets", namespace, names.disruption_budget(session.metadata.name or "")
    )
    wanted = session.spec.migration.eviction_strategy is EvictionStrategy.LIVE_MIGRATE
    existing = await ctx.api.get(path)
    budget = manifests.owner_budget(session)
    if wanted and existing is None:
        with contextlib.suppress(AlreadyExists):
            await ctx.api.create(namespaced("poddisruptionbudgets", namespace), budget)
    elif wanted and existing is not None and existing.get("spec") != budget["spec"]:
        # One an earlier operator made (``maxUnavailable: 0``, which the disruption
        # controller cannot compute for a pod an AgentSession owns): made right.
        await ctx.api.patch(path, {"spec": {"maxUnavailable": None, **budget["spec"]}})
    elif not wanted and existing is not None:
        await ctx.api.delete(path)


def pod_ready(pod: dict[str, Any] | None) -> bool:
    if pod is None:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions", [])
    )


async def owner_pod(
    ctx: OperatorContext, namespace: str, name: str | None
) -> dict[str, Any] | None:
    """The pod ``name`` as the pod watch last showed it (``watchedpods``), or read when
    the watch has not shown it yet (just made, or the operator just started)."""
    if name is None:
        return None
    return ctx.watched_pods.get(namespace, name) or await ctx.api.get(
        namespaced("pods", namespace, name)
    )


def pod_dead(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") in ("Failed", "Succeeded") or bool(
        pod["metadata"].get("deletionTimestamp")
    )


def container_image(pod: dict[str, Any]) -> str:
    containers = pod["spec"]["containers"]
    return str(
        next((c for c in containers if c["name"] == names.AGENT_CONTAINER), containers[0])["image"]
    )


@dataclass
class Observed:
    """What one reconcile saw, for the status. ``journal`` and ``last`` unseen (None)
    are left as the status has them."""

    phase: str
    epoch: int | None = None
    owner: str | None = None
    node: str | None = None
    image: str | None = None
    ready: bool = False
    journal: JournalStatus | None = None
    active: str | None = None
    last: MigrationSummary | None = None
    degraded: Problem | None = None
    suspension: Suspension | None = None


def last_migration(
    migrations: list[dict[str, Any]], stored: MigrationSummary | None
) -> MigrationSummary | None:
    """The session's latest migration to have run and ended: from its AgentMigrations,
    or ``stored`` (the status's) when that one ended later — a migration deleted once
    it ended (a cancelled one, say) is gone from the list, not from the session's past."""
    latest: MigrationSummary | None = None
    for migration in migrations:  # oldest first: on a tie, the newer one
        summary = summary_of(migration)
        if summary is not None and (latest is None or _ended(summary) >= _ended(latest)):
            latest = summary
    if stored is None or any(m["metadata"]["name"] == stored.name for m in migrations):
        return latest
    if latest is None or _ended(stored) > _ended(latest).replace(microsecond=0):
        return stored
    return latest


def _ended(summary: MigrationSummary) -> datetime:
    return summary.completion_time or summary.start_time or datetime.min.replace(tzinfo=UTC)


async def reconcile(ctx: OperatorContext, body: dict[str, Any]) -> Observed:
    """One pass over the session (see the module's docstring)."""
    session = await following.effective(ctx, body)
    namespace, name = session.metadata.namespace or "default", session.metadata.name or ""
    found = await problems(ctx, session)
    key = f"{namespace}/{name}"
    said = ctx.problems_said.get(key) or _degraded_reason(body)
    if found and said != found[0].reason:  # a new problem: said once, not every pass
        for problem in found:
            await ctx.event(body, "Warning", problem.reason, problem.message)
    if found:
        ctx.problems_said[key] = found[0].reason
    else:
        ctx.problems_said.pop(key, None)
    status = body.get("status") or {}
    generation = body["metadata"].get("generation")
    # The Secret, the gateway session and the budget were made for this spec already:
    # a steady pass only looks at the owner (thousands of sessions, every few seconds).
    established = status.get("epoch") is not None and status.get("observedGeneration") == generation
    if not established:
        token, owner_key = await ensure_token_secret(ctx, session)
        refused = await ensure_gateway_session(ctx, session, token, owner_key)
        if refused is not None:
            if said != refused.reason:
                await ctx.event(body, "Warning", refused.reason, refused.message)
            ctx.problems_said[key] = refused.reason
            return Observed(phase="Pending", degraded=refused)
    gid = gateway_id(session)
    ownership = await gateway_call(ctx, lambda: ctx.admin.ownership(gid))
    if ownership.owner is None:  # new (epoch 0), or a fork (its parent's epoch)
        change = OwnershipChange(
            expect_epoch=ownership.epoch,
            epoch=ownership.epoch + 1,
            owner=names.new_instance(name),
        )
        ownership = await gateway_call(ctx, lambda: ctx.admin.set_ownership(gid, change))
    if not established:
        await ensure_budget(ctx, session)
    migrations = await migrations_of(ctx, namespace, name)
    active = next((m for m in migrations if unfinished(m)), None)
    last = last_migration(
        migrations, None if session.status is None else session.status.last_migration
    )
    if active is None and suspensions.is_suspended(ownership):
        return await _suspended(ctx, body, session, ownership, last, found)
    recorded_owner = (body.get("status") or {}).get("ownerPod")
    pod = await owner_pod(ctx, namespace, ownership.owner)
    # A validation policy that cannot run holds image changes back, not the session.
    gated = any(p.reason == validation.InvalidValidationPolicy.reason for p in found)
    blocking = [p for p in found if p.reason != validation.InvalidValidationPolicy.reason]
    if active is None and blocking and pod is None:
        # Nothing runs yet, and it could not start right: say so and wait for a fix.
        return Observed(phase="Pending", epoch=ownership.epoch, last=last, degraded=blocking[0])
    if active is None and (pod is None or pod_dead(pod)):
        if pod is not None or recorded_owner == ownership.owner:
            ownership, pod = await _replace_owner(ctx, body, session, ownership, pod)
        elif session.spec.operating_mode is OperatingMode.SUSPENDED:
            # Its owner never started: none is, only to be suspended once it serves.
            done = await suspensions.suspend(
                ctx, body, session, ownership, SuspendReason.REQUESTED, started=False
            )
            if done is not None:
                return await _now_suspended(ctx, gid, done, last, found)
        else:
            pod = await _create_owner(ctx, session, ownership.owner, ownership.epoch)
    if active is None and pod is not None and not pod_dead(pod) and pod_ready(pod):
        reason = await suspensions.due(ctx, session, gid, pod)
        if reason is not None:
            done = await suspensions.suspend(ctx, body, session, ownership, reason)
            if done is not None:
                return await _now_suspended(ctx, gid, done, last, found)
        active = await _maybe_migrate(
            ctx, session, body, pod, migrations, gated=gated or following.rolled_out(body)
        )
    position = await _position(ctx, gid)
    ready = pod_ready(pod)
    phase = "Migrating" if active is not None else ("Running" if ready else "Pending")
    return Observed(
        phase=phase,
        epoch=ownership.epoch,
        owner=ownership.owner,
        node=None if pod is None else pod["spec"].get("nodeName"),
        image=None if pod is None else container_image(pod),
        ready=ready,
        journal=position,
        active=None if active is None else active["metadata"]["name"],
        last=last,
        degraded=found[0] if found else None,
    )


async def _position(ctx: OperatorContext, gid: str) -> JournalStatus | None:
    """The journal's position, shown when the gateway answers."""
    with contextlib.suppress(GatewayError, aiohttp.ClientError, TimeoutError):
        journal = await ctx.admin.status(gid)
        acked = min(journal.head, max(journal.acks.values(), default=0))
        return JournalStatus(head_seq=journal.head, acked_seq=acked)
    return None


async def _now_suspended(
    ctx: OperatorContext,
    gid: str,
    done: tuple[Ownership, Suspension],
    last: MigrationSummary | None,
    found: list[Problem],
) -> Observed:
    """What a pass that has just suspended the session saw."""
    suspended, suspension = done
    return Observed(
        phase="Suspended",
        epoch=suspended.epoch,
        journal=await _position(ctx, gid),
        last=last,
        degraded=found[0] if found else None,
        suspension=suspension,
    )


async def _suspended(
    ctx: OperatorContext,
    body: dict[str, Any],
    session: AgentSession,
    ownership: Any,
    last: MigrationSummary | None,
    found: list[Problem],
) -> Observed:
    """A suspended session: left so, or resumed — the owner the suspension named
    started, and delivery opened to it once it is ready."""
    gid = gateway_id(session)
    namespace = session.metadata.namespace or "default"
    stored = None if session.status is None else session.status.suspension
    degraded = found[0] if found else None
    if stored is None:
        # The body may predate the pass that suspended it (a timer's, a wake's, its
        # creation's): the reason is in the status that pass wrote; read it before
        # resuming, or before writing a status that would drop it.
        fresh = await ctx.api.get(namespaced("agentsessions", namespace, session.metadata.name))
        if fresh is not None:
            session = session_model(fresh)
            stored = None if session.status is None else session.status.suspension
    if suspensions.stays_suspended(session, ownership):
        return Observed(
            phase="Suspended",
            epoch=ownership.epoch,
            journal=await _position(ctx, gid),
            last=last,
            degraded=degraded,
            suspension=stored,
        )
    pod = await owner_pod(ctx, namespace, ownership.owner)
    if pod is not None and pod_dead(pod):
        # The next owner died before it served: a new one at a new epoch (delivery
        # opens with it), as for any owner that died.
        ownership, pod = await _replace_owner(ctx, body, session, ownership, pod)
    elif pod is None:
        pod = await _create_owner(ctx, session, ownership.owner, ownership.epoch)
        await ctx.event(
            body,
            "Normal",
            "Resuming",
            f"owner {ownership.owner} starts at epoch {ownership.epoch} from the latest"
            " snapshot and the journal",
        )
    ready = pod_ready(pod)
    if ready and suspensions.is_suspended(ownership):
        ownership = await gateway_call(
            ctx, lambda: ctx.admin.resume(gid, expect_epoch=ownership.epoch)
        )
        await ctx.event(
            body, "Normal", "Resumed", f"owner {ownership.owner} serves what waited, in order"
        )
    return Observed(
        phase="Running" if ready else "Resuming",
        epoch=ownership.epoch,
        owner=ownership.owner,
        node=pod["spec"].get("nodeName"),
        image=container_image(pod),
        ready=ready,
        journal=await _position(ctx, gid),
        last=last,
        degraded=degraded,
        suspension=None if ready else stored,
    )


async def _create_owner(
    ctx: OperatorContext, session: AgentSession, instance: str, epoch: int
) -> dict[str, Any]:
    namespace = session.metadata.namespace or "default"
    pod = manifests.agent_pod(
        session, instance=instance, gateway_session=gateway_id(session), mode="owner", epoch=epoch
    )
    await give_owner_credential(
        ctx.api, namespace, session.metadata.name or "", gateway_id(session), instance
    )
    try:
        return await ctx.api.create(namespaced("pods", namespace), pod)
    except AlreadyExists:
        found = await ctx.api.get(namespaced("pods", namespace, instance))
        return found if found is not None else pod


async def _replace_owner(
    ctx: OperatorContext,
    body: dict[str, Any],
    session: AgentSession,
    ownership: Any,
    dead: dict[str, Any] | None,
) -> tuple[Any, dict[str, Any]]:
    """A new owner at a new epoch for one that died outside a migration; the old pod's
    epoch is fenced before the new pod exists, so a zombie of it can write nothing."""
    name = session.metadata.name or ""
    namespace = session.metadata.namespace or "default"
    gid = gateway_id(session)
    instance = names.new_instance(name)
    change = OwnershipChange(
        expect_epoch=ownership.epoch, epoch=ownership.epoch + 1, owner=instance
    )
    new = await gateway_call(ctx, lambda: ctx.admin.set_ownership(gid, change))
    what = "is gone" if dead is None else f"ended ({(dead.get('status') or {}).get('phase')})"
    await ctx.event(
        body,
        "Warning",
        "OwnerReplaced",
        f"owner pod {ownership.owner} {what}: new owner {instance} at epoch {new.epoch},"
        " from the latest snapshot and the journal",
    )
    if dead is not None:
        await ctx.api.delete(namespaced("pods", namespace, ownership.owner), grace_s=0)
    return new, await _create_owner(ctx, session, instance, new.epoch)


def _image_migration(
    session: AgentSession,
    body: dict[str, Any],
    pod: dict[str, Any],
    migrations: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """The AgentMigration an image change asks for, if one is due: the owner ``pod``
    runs another image than ``spec.image``, the user did not put it there by hand at
    this generation, and this change was not tried already."""
    if session.spec.image is None or container_image(pod) == session.spec.image:
        return None
    generation = int(body["metadata"].get("generation") or 1)
    if _moved_by_hand(migrations, container_image(pod), generation):
        return None
    wanted = names.image_migration(session.metadata.name or "", generation)
    if any(m["metadata"]["name"] == wanted for m in migrations):
        return None  # this change was tried (and failed): wait for the next one
    return manifests.agent_migration(
        session, name=wanted, reason="ImageChange", image=session.spec.image
    )


async def _maybe_migrate(
    ctx: OperatorContext,
    session: AgentSession,
    body: dict[str, Any],
    pod: dict[str, Any],
    migrations: list[dict[str, Any]],
    *,
    gated: bool = False,
) -> dict[str, Any] | None:
    """An AgentMigration for an image change or a cordoned node, if one is due. An
    image change waits while the session's validation policy is invalid (``gated``):
    it would run a gate that cannot run; a drain keeps the image and is not gated. A
    rolled-out session (``following``) is ``gated`` too: its rollouts change its image."""
    name = session.metadata.name or ""
    migration: dict[str, Any] | None = None
    if session.spec.image is not None and container_image(pod) != session.spec.image:
        if gated:
            return None
        migration = _image_migration(session, body, pod, migrations)
    elif session.spec.migration.eviction_strategy is EvictionStrategy.LIVE_MIGRATE:
        node = pod["spec"].get("nodeName")
        if node and await _cordoned(ctx, node):
            wanted = names.drain_migration(name, node, pod["metadata"]["name"])
            if any(m["metadata"]["name"] == wanted for m in migrations):
                return None
            # The same image anywhere else: the scheduler keeps off the cordoned node.
            migration = manifests.agent_migration(
                session, name=wanted, reason="NodeDrain", image=container_image(pod)
            )
    if migration is None:
        return None
    return await _create_migration(ctx, body, migration)


async def _create_migration(
    ctx: OperatorContext, body: dict[str, Any], migration: dict[str, Any]
) -> dict[str, Any] | None:
    """``migration`` made (None: it exists already), and said on the session."""
    namespace = body["metadata"]["namespace"]
    try:
        created = await ctx.api.create(namespaced("agentmigrations", namespace), migration)
    except AlreadyExists:
        return None
    reason = migration["spec"]["reason"]
    await ctx.event(
        body,
        "Normal",
        "MigrationCreated",
        f"{reason}: AgentMigration {migration['metadata']['name']}",
    )
    return created


async def migrate_on_image_change(ctx: OperatorContext, body: dict[str, Any]) -> str | None:
    """The quick path of an image change (``handlers.image_changed``, before the pass
    the spec change also gets): the AgentMigration made from what the watches show — the
    owner the status names, its pod from the pod watch — and the session's migrations
    listed; two requests, where a pass makes a dozen before it. Under load the moves
    already running take the operator's time: a bump's move no longer waits behind a
    whole pass. Only the plain case is taken (a steady session with its own image, no
    validation gate to check, no rollout choosing its image); anything else, and
    whatever this path finds not so, is the pass's, which follows. The name of the
    migration made, if one was."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    meta = body["metadata"]
    if (
        meta.get("deletionTimestamp")
        or not spec.get("image")
        or spec.get("deploymentRef")
        or (spec.get("migration") or {}).get("validation")
        or status.get("phase") != "Running"
        or status.get("activeMigration")
        or not status.get("ownerPod")
        or image_problem(spec["image"]) is not None
    ):
        return None
    namespace, name = meta["namespace"], meta["name"]
    # Not under the session's lock: a pass of this session in flight (its pod became
    # ready, say) may wait minutes on a slow gateway. What this path writes is the
    # migration the pass would make, by the same name: made once whoever comes first.
    pod = await owner_pod(ctx, namespace, status["ownerPod"])
    if pod is None or pod_dead(pod) or not pod_ready(pod):
        return None
    if container_image(pod) == spec["image"]:
        return None
    session = session_model(body)
    migrations = await migrations_of(ctx, namespace, name)
    if any(unfinished(m) for m in migrations):
        return None
    migration = _image_migration(session, body, pod, migrations)
    if migration is None or await _create_migration(ctx, body, migration) is None:
        return None
    return str(migration["metadata"]["name"])


def _moved_by_hand(migrations: list[dict[str, Any]], image: str, generation: int) -> bool:
    """The owner runs ``image`` because a user's AgentMigration put it there while the
    spec was at ``generation``: the move is kept (not undone to ``spec.image``) until
    the spec changes."""
    for migration in migrations:
        annotations = migration["metadata"].get("annotations") or {}
        if (
            (migration.get("status") or {}).get("result") == "Succeeded"
            and ((migration.get("spec") or {}).get("target") or {}).get("image") == image
            and annotations.get(names.SESSION_GENERATION_ANNOTATION) == str(generation)
        ):
            return True
    return False


async def _cordoned(ctx: OperatorContext, node: str) -> bool:
    found = await ctx.api.get(f"/api/v1/nodes/{node}")
    return found is not None and bool((found.get("spec") or {}).get("unschedulable"))


def session_status(body: dict[str, Any], seen: Observed) -> AgentSessionStatus:
    """The session's status for what ``reconcile`` saw: every condition type set."""
    generation = body["metadata"].get("generation")
    old = [
        SessionCondition.model_validate(c) for c in (body.get("status") or {}).get("conditions", [])
    ]
    ready: tuple[ConditionStatus, str, str]
    migrating: tuple[ConditionStatus, str, str]
    degraded: tuple[ConditionStatus, str, str]
    if seen.ready:
        ready = ("True", "OwnerReady", f"owner pod {seen.owner} serves at epoch {seen.epoch}")
    elif seen.phase == "Suspended":
        why = "operatingMode is Suspended: set it to Running to resume"
        if seen.suspension is not None and seen.suspension.reason == "Idle":
            why = "idle: the next message wakes it"
        ready = ("False", "Suspended", f"no owner runs ({why}); messages wait in the journal")
    elif seen.phase == "Resuming":
        ready = ("False", "Resuming", f"owner pod {seen.owner} starts at epoch {seen.epoch}")
    else:
        ready = ("False", "OwnerNotReady", f"owner pod {seen.owner or '(none yet)'} is not ready")
    if seen.active is not None:
        migrating = ("True", "MigrationRunning", f"AgentMigration {seen.active} runs")
    else:
        migrating = ("False", "NoMigration", "no migration runs")
    last = seen.last
    if seen.degraded is not None:
        degraded = ("True", seen.degraded.reason, seen.degraded.message)
    elif seen.active is None and last is not None and last.result in ("RolledBack", "Failed"):
        degraded = (
            "True",
            last.reason or "MigrationFailed",
            f"AgentMigration {last.name} {last.result}: the session stays on"
            f" {seen.image}; kubectl describe agm {last.name} says why"
            + (
                f" (kubectl shadowpod diff {last.name}: both versions' answers)"
                if last.reason == "ValidationFailed"
                else ""
            ),
        )
    else:
        degraded = ("False", "AsExpected", "nothing needs attention")
    conds = old
    states: tuple[tuple[str, tuple[ConditionStatus, str, str]], ...] = (
        ("Ready", ready),
        ("Migrating", migrating),
        ("Degraded", degraded),
    )
    for kind, (state, reason, message) in states:
        conds = conditions.set_condition(
            conds,
            SessionCondition,
            kind,
            state,
            reason,
            message,
            generation=generation,
        )
    # Unseen (None) is not written, so the stored value stays; a field set to None is.
    seen_only: dict[str, Any] = {}
    if seen.journal is not None:
        seen_only["journal"] = seen.journal
    if seen.last is not None:
        seen_only["last_migration"] = seen.last
    if (
        seen.phase in ("Suspended", "Resuming")
        or (body.get("status") or {}).get("suspension") is not None
    ):
        seen_only["suspension"] = seen.suspension  # set, or removed once it serves again
    return AgentSessionStatus(
        observed_generation=generation,
        phase=seen.phase,
        epoch=seen.epoch,
        owner_pod=seen.owner,
        node_name=seen.node,
        image=seen.image,
        active_migration=seen.active,
        conditions=conds,
        **seen_only,
    )


def status_patch(status: AgentSessionStatus) -> dict[str, Any]:
    """A merge patch that writes ``status``: what it set, ``None`` as null (removed);
    what it left unset, as stored."""
    patch = status.model_dump(mode="json", by_alias=True, exclude_unset=True)
    patch["conditions"] = [
        c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in status.conditions
    ]
    return {"status": patch}


def lock(ctx: OperatorContext, namespace: str, name: str) -> asyncio.Lock:
    """One pass at a time over a session (its deletion included) in this operator."""
    return ctx.lock(f"session/{namespace}/{name}")


async def reconcile_and_patch(ctx: OperatorContext, body: dict[str, Any]) -> bool | None:
    """One pass over the session (``body``, the freshest the caller has), and its
    status written; whether its owner serves now (None: no pass was made). A pass that
    fails is said — ``Degraded`` with the reason, a Warning event,
    ``shadowpod_reconcile_errors_total`` — and backed off: passes skip it until its wait
    (doubled by each failure) is over or its spec changes (``backoff``)."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return None
    key = (meta["namespace"], meta["name"])
    failing = backoff_key("AgentSession", body)
    if not ctx.backoff.due(failing, meta.get("generation")):
        return None
    async with lock(ctx, *key):
        try:
            seen = await reconcile(ctx, body)
        except (ShadowpodError, ValidationError) as exc:
            failure = await ctx.reconcile_failed(body, "AgentSession", exc)
            await ctx.api.patch(
                _status_path(*key),
                status_patch(session_status(body, _as_stored(body, failure, exc))),
            )
            return None
        await ctx.api.patch(_status_path(*key), status_patch(session_status(body, seen)))
        ctx.count_session(key, seen.phase, ready=seen.ready)
        if seen.phase == "Pending" and seen.degraded is not None and seen.owner is None:
            # It could not start: its spec is unusable (said as Degraded). Backed off
            # and counted as a failure, like a pass that raised.
            ctx.backoff.failed(failing, meta.get("generation"))
            ctx.metrics.reconcile_errors.labels(
                kind="AgentSession", reason=seen.degraded.reason
            ).inc()
        else:
            ctx.backoff.succeeded(failing)
        return seen.ready


def needs_passes(body: Mapping[str, Any], **_: Any) -> bool:
    """Whether the session keeps a periodic pass: while it is not steady. A steady
    session (its owner ready at the spec it was made for, nothing degraded, no
    migration; or suspended) changes only by what the operator is told of: a watch
    event (spec, owner pod, node, migration), a wake, or the gateway's positions
    (``kube.positions``). Idleness is a matter of time, not of events: a session that
    suspends when idle keeps its passes while it runs."""
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    if status.get("observedGeneration") != body.get("metadata", {}).get("generation"):
        return True
    if status.get("activeMigration") or status.get("epoch") is None:
        return True
    state = {c.get("type"): c.get("status") for c in status.get("conditions", [])}
    if state.get("Degraded") != "False" and not _degraded_by_last_move(status):
        return True
    phase = status.get("phase")
    if phase == "Suspended":
        return False
    return phase != "Running" or state.get("Ready") != "True" or bool(spec.get("idleSuspendAfter"))


def _degraded_by_last_move(status: Mapping[str, Any]) -> bool:
    """Degraded only because its last migration failed or was rolled back: it runs on
    as before, and what would change that (a new spec, its pod) is a watch event. A
    periodic pass for it would cost O(sessions) after a rollout that failed
    everywhere."""
    last = status.get("lastMigration") or {}
    degraded: Mapping[str, Any] = next(
        (c for c in status.get("conditions", []) if c.get("type") == "Degraded"), {}
    )
    return (
        degraded.get("status") == "True"
        and last.get("result") in ("RolledBack", "Failed")
        and str(degraded.get("message", "")).startswith(f"AgentMigration {last.get('name')} ")
    )


def watched(ctx: OperatorContext, body: Mapping[str, Any], *, gone: bool) -> None:
    """Keep the session's status as the watch delivered it (``kube.positions``)."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if gone:
        ctx.watched_sessions.pop(key, None)
    else:
        ctx.watched_sessions[key] = dict(body.get("status") or {})


async def refresh_journal(
    ctx: OperatorContext, namespace: str, name: str, journal: JournalStatus
) -> None:
    """The journal figures of the session's status, from the gateway's positions: the
    one write to a status besides a pass's (nothing else in it depends on them)."""
    async with lock(ctx, namespace, name):
        patch = {"status": {"journal": journal.model_dump(mode="json", by_alias=True)}}
        await ctx.api.patch(_status_path(namespace, name), patch)


async def reconcile_named(ctx: OperatorContext, namespace: str, name: str) -> None:
    """``reconcile_and_patch`` for the session ``name``, read first (gone: nothing)."""
    body = await ctx.api.get(namespaced("agentsessions", namespace, name))
    if body is not None:
        await reconcile_and_patch(ctx, body)


def _status_path(namespace: str, name: str) -> str:
    return f"{namespaced('agentsessions', namespace, name)}/status"


def _as_stored(body: dict[str, Any], failure: Failure, exc: Exception) -> Observed:
    """What a pass that failed knows: the status as stored, and what went wrong."""
    status = body.get("status") or {}
    last = None
    with contextlib.suppress(ValidationError):  # the body may be what failed to validate
        last = MigrationSummary.model_validate(status.get("lastMigration"))
    return Observed(
        phase=status.get("phase", "Pending"),
        epoch=status.get("epoch"),
        owner=status.get("ownerPod"),
        image=status.get("image"),
        active=status.get("activeMigration"),
        last=last,
        degraded=Problem(
            failure.reason, f"{exc}; the operator tries again in {failure.retry_s:g} s"
        ),
    )
