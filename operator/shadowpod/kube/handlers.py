"""Every Kopf handler of the operator, and its settings: each a few lines, body →
model → call → status (the reconciling is in ``sessions``, ``migrations``, ``cleanup``).

- AgentSession: reconciled on create, on resume, on a spec change and every
  ``reconcile_interval_s`` (level-triggered: an owner pod that died, a cordoned node,
  a queued image change are found by the next pass); a finalizer cleans up.
- AgentMigration: a daemon per unfinished migration runs the engine; deleting it
  cancels it (Kopf stops the daemon, which rolls back before releasing).
- Node: a cordon is seen at once, and the sessions on it are reconciled.

Errors never crash-loop: a reconcile that fails sets ``Degraded`` with the reason,
posts a Warning event, counts in ``shadowpod_reconcile_errors_total``, and is tried
again after a wait that doubles with each failure of that object (``backoff``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from typing import Any, Final

import aiohttp
import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config
from pydantic import ValidationError

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.errors import ShadowpodError
from shadowpod.kube import cleanup, migrations, names, sessions
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.config import OperatorConfig
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.metrics import OperatorMetrics
from shadowpod.kube.models.v1alpha1 import GROUP, VERSION

logger = logging.getLogger("shadowpod.operator")

SESSIONS: Final = (GROUP, VERSION, "agentsessions")
MIGRATIONS: Final = (GROUP, VERSION, "agentmigrations")
# A stopped daemon lets go at once (the record is saved before every step); this is
# only how long Kopf waits before it cancels one that did not.
CANCELLATION_BACKOFF_S: Final = 10.0


def configure(settings: kopf.OperatorSettings) -> None:
    """The operator's Kopf settings: its own finalizer and annotation prefixes, explicit
    watch timeouts (a silent watch is restarted, never trusted forever)."""
    settings.persistence.finalizer = names.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.PREFIX, key="last-handled-configuration"
    )
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 70
    settings.watching.connect_timeout = 5
    settings.networking.request_timeout = 30
    settings.posting.level = logging.WARNING


async def api_client(kubeconfig: str | None) -> client.ApiClient:
    return client.ApiClient(await api_configuration(kubeconfig))


async def api_configuration(kubeconfig: str | None) -> client.Configuration:
    """In-cluster credentials (a ServiceAccount), else ``kubeconfig`` or $KUBECONFIG."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        await kube_config.load_kube_config(
            config_file=kubeconfig, client_configuration=configuration, persist_config=False
        )
    else:
        try:
            kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except kube_config.ConfigException:
            await kube_config.load_kube_config(
                client_configuration=configuration, persist_config=False
            )
    return configuration


async def connection_info(kubeconfig: str | None) -> kopf.ConnectionInfo:
    """Kopf's credentials from the same source as the operator's own client (Kopf's
    default logins need a client library the operator does not ship)."""
    settings = await api_configuration(kubeconfig)
    keys = settings.api_key or {}
    scheme, _, token = (keys.get("authorization") or keys.get("BearerToken") or "").partition(" ")
    return kopf.ConnectionInfo(
        server=str(settings.host),
        ca_path=settings.ssl_ca_cert,
        insecure=not settings.verify_ssl,
        scheme=scheme or None if token else None,
        token=token or None,
        certificate_path=settings.cert_file,
        private_key_path=settings.key_file,
    )


def registry(
    config: OperatorConfig, metrics: OperatorMetrics | None = None
) -> kopf.OperatorRegistry:
    """The operator's handlers, in a registry of their own (tests run several)."""
    reg = kopf.OperatorRegistry()
    metrics = metrics or OperatorMetrics()
    holder: dict[str, OperatorContext] = {}
    stack = AsyncExitStack()

    def ctx() -> OperatorContext:
        return holder["ctx"]

    def lock(namespace: str, name: str) -> asyncio.Lock:
        return ctx().lock(f"session/{namespace}/{name}")

    kubeconfig = None if config.kubeconfig is None else str(config.kubeconfig)

    @kopf.on.login(registry=reg)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection_info(kubeconfig)

    @kopf.on.startup(registry=reg)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        api = await stack.enter_async_context(await api_client(kubeconfig))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        admin = await stack.enter_async_context(
            GatewayClient(config.gateway_url, config.control_token)
        )
        holder["ctx"] = OperatorContext(KubeApi(api), admin, http, config, metrics)

    @kopf.on.cleanup(registry=reg)
    async def shutdown(**_: Any) -> None:
        await stack.aclose()

    async def reconcile_session(body: kopf.Body, patch: kopf.Patch) -> None:
        raw: dict[str, Any] = dict(body)
        meta = raw["metadata"]
        key = (meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp") or not _due(ctx(), "AgentSession", raw):
            return
        async with lock(*key):
            try:
                seen = await sessions.reconcile(ctx(), raw)
            except (ShadowpodError, ValidationError) as exc:
                await _failed(ctx(), raw, "AgentSession", exc, patch)
                return
            _settle(ctx(), raw, seen)
            patch.status.update(sessions.status_patch(raw, seen))
            ctx().count_session(key, seen.phase, ready=seen.ready)

    @kopf.on.resume(*SESSIONS, registry=reg)
    @kopf.on.create(*SESSIONS, registry=reg)
    @kopf.on.update(*SESSIONS, field="spec", registry=reg)
    async def session_changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await reconcile_session(body, patch)

    @kopf.timer(*SESSIONS, interval=config.reconcile_interval_s, registry=reg)
    async def session_timer(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        # Kopf passes timers their `stopped` too (TimerFn's type does not declare it).
        await _unless_stopped(reconcile_session(body, patch), kwargs["stopped"])

    @kopf.on.delete(*SESSIONS, registry=reg)
    async def session_deleted(body: kopf.Body, retry: int, **_: Any) -> None:
        raw: dict[str, Any] = dict(body)
        meta = raw["metadata"]
        async with lock(meta["namespace"], meta["name"]):
            await cleanup.delete_session(ctx(), raw, attempt=retry)
        ctx().backoff.succeeded(_backoff_key("AgentSession", raw))
        ctx().count_session((meta["namespace"], meta["name"]), None, ready=True)

    @kopf.daemon(
        *MIGRATIONS,
        cancellation_backoff=CANCELLATION_BACKOFF_S,
        cancellation_timeout=30.0,
        registry=reg,
    )
    async def migration_daemon(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        raw: dict[str, Any] = dict(body)
        while not stopped:
            try:
                await migrations.run(ctx(), raw, stopped)
            except (ShadowpodError, ValidationError) as exc:
                delay = await _failed(ctx(), raw, "AgentMigration", exc, None)
                await stopped.wait(delay)
                continue
            ctx().backoff.succeeded(_backoff_key("AgentMigration", raw))
            # Its session is looked at now: an image change queued behind this
            # migration starts at once, not at the session's next timer.
            meta = raw["metadata"]
            ref = (raw.get("spec") or {}).get("sessionRef") or {}
            if not stopped and ref.get("name"):
                session = await ctx().api.get(
                    namespaced("agentsessions", meta["namespace"], ref["name"])
                )
                if session is not None:
                    await _poke(session)
            return

    @kopf.on.delete(*MIGRATIONS, registry=reg)
    async def migration_deleted(body: kopf.Body, **_: Any) -> None:
        """A cancel: rolled back (or finished, past the cutover) before the finalizer goes."""
        await migrations.cancel(ctx(), dict(body))

    @kopf.on.field("", "v1", "nodes", field="spec.unschedulable", registry=reg)
    async def node_cordoned(name: str, new: Any, **_: Any) -> None:
        if not new:
            return
        logger.info("node %s is cordoned: its sessions move off it", name, extra={"node": name})
        await cleanup.reconcile_sessions_on(ctx(), name, _poke)

    @kopf.on.event("", "v1", "pods", labels={names.SESSION_LABEL: kopf.PRESENT}, registry=reg)
    async def pod_changed(body: kopf.Body, type: str | None, **_: Any) -> None:
        """An owner pod that became ready, stopped being ready or went: its session is
        looked at now, not at its next timer."""
        labels = body.get("metadata", {}).get("labels", {})
        if labels.get(names.ROLE_LABEL) != names.OWNER_ROLE or type is None:
            return
        namespace = body["metadata"]["namespace"]
        session = await ctx().api.get(
            namespaced("agentsessions", namespace, labels[names.SESSION_LABEL])
        )
        if session is None:
            return
        status = session.get("status") or {}
        ready = sessions.pod_ready(dict(body)) and type != "DELETED"
        was_ready = status.get("phase") == "Running"
        if ready != was_ready or status.get("ownerPod") != body["metadata"]["name"]:
            await _poke(session)

    async def _poke(body: dict[str, Any]) -> None:
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return
        key = (meta["namespace"], meta["name"])
        if not _due(ctx(), "AgentSession", body):
            return
        async with lock(*key):
            try:
                seen = await sessions.reconcile(ctx(), body)
            except (ShadowpodError, ValidationError) as exc:
                await _failed(ctx(), body, "AgentSession", exc, None)
                return
            _settle(ctx(), body, seen)
            path = namespaced("agentsessions", key[0], key[1])
            await ctx().api.patch(f"{path}/status", {"status": sessions.status_patch(body, seen)})
            ctx().count_session(key, seen.phase, ready=seen.ready)

    return reg


async def _unless_stopped(work: Coroutine[Any, Any, None], stopped: kopf.DaemonStopped) -> None:
    """Run ``work`` until it ends or ``stopped`` is set, then cancel it. Kopf never
    cancels a timer: one mid-pass when its session goes or the operator stops would be
    left running, orphaned, with its connections open.

    ``work`` runs in a task of its own that never ends in an exception (its error is
    raised here, in the handler, where Kopf reports it): an operator that stops
    re-raises whatever error any leftover task of its loop ended with."""

    async def guarded() -> BaseException | None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - raised below, in the handler
            return exc
        return None

    task = asyncio.ensure_future(guarded())
    halt = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        halt.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await halt
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if not task.cancelled() and (error := task.result()) is not None:
        raise error


def _backoff_key(kind: str, body: dict[str, Any]) -> tuple[str, str, str]:
    return (kind, body["metadata"]["namespace"], body["metadata"]["name"])


def _due(ctx: OperatorContext, kind: str, body: dict[str, Any]) -> bool:
    """Not backing off after failures (see ``backoff``): a timer's pass or a pod's
    change skips an object that failed until its wait is over or its spec changes."""
    return ctx.backoff.due(_backoff_key(kind, body), body["metadata"].get("generation"))


def _settle(ctx: OperatorContext, body: dict[str, Any], seen: sessions.Observed) -> None:
    """A session that could not start (its spec is unusable: said as ``Degraded``) is
    backed off as a failure; any other pass ends its backoff."""
    key = _backoff_key("AgentSession", body)
    if seen.phase == "Pending" and seen.degraded is not None and seen.owner is None:
        ctx.backoff.failed(key, body["metadata"].get("generation"))
        ctx.metrics.reconcile_errors.labels(kind="AgentSession", reason=seen.degraded.reason).inc()
    else:
        ctx.backoff.succeeded(key)


async def _failed(
    ctx: OperatorContext,
    body: dict[str, Any],
    kind: str,
    exc: ShadowpodError | ValidationError,
    patch: kopf.Patch | None,
) -> float:
    """Said on the object (a condition, a Warning event), counted, and backed off:
    the seconds until it is tried again."""
    # A spec the API server admitted but the operator's models refuse: a CRD older
    # than the operator, say. Said on the object; the next pass tries again.
    reason = "InvalidSpec" if isinstance(exc, ValidationError) else exc.reason
    delay = ctx.backoff.failed(_backoff_key(kind, body), body["metadata"].get("generation"))
    logger.warning(
        "%s %s/%s: %s: %s",
        kind,
        body["metadata"]["namespace"],
        body["metadata"]["name"],
        reason,
        exc,
    )
    ctx.metrics.reconcile_errors.labels(kind=kind, reason=reason).inc()
    again = f"trying again in {delay:g} s"
    await ctx.event(body, "Warning", reason, f"{exc}; {again}")
    if patch is not None:
        seen = sessions.Observed(
            phase=(body.get("status") or {}).get("phase", "Pending"),
            epoch=(body.get("status") or {}).get("epoch"),
            owner=(body.get("status") or {}).get("ownerPod"),
            image=(body.get("status") or {}).get("image"),
            active=(body.get("status") or {}).get("activeMigration"),
            degraded=sessions.Problem(reason, f"{exc}; the operator is {again}"),
        )
        patch.status.update(sessions.status_patch(body, seen))
    return delay
