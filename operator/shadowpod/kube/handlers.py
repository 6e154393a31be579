"""Every Kopf handler of the operator, and its settings: module-level functions, each
a few lines that call the reconcilers (``sessions``, ``migrations``, ``cleanup``),
registered by ``registry`` on a registry of their own. What the operator holds (its
API client, the gateway's, settings, metrics) is in Kopf's memo, an ``OperatorMemo``
given to ``kopf.operator`` and filled by the startup handler.

- AgentSession: reconciled on create, on resume, on a spec change, and every
  ``reconcile_interval_s`` while it is not steady (``sessions.needs_passes``); a
  steady one is looked at when an event says so, and by one read of every session's
  position at the gateway per period (``positions``: its idle cost does not grow with
  the sessions); a finalizer cleans up.
- AgentMigration: a daemon per unfinished migration waits in the cluster-wide pacing
  queue (``admission``, one loop started at startup), then runs the engine; deleting
  it cancels it (Kopf stops the daemon, which rolls back before releasing).
- AgentDeployment: its rollout planned on create, resume, any change (the plugin's
  resume and abort are annotations), every ``reconcile_interval_s``, and when one of
  its migrations ends or one of its sessions starts or stops serving (``rollouts``).
- Node: a cordon is seen at once, and the sessions on it are reconciled.
- Pod: an owner pod that became ready, stopped being ready or went: its session is
  reconciled at once. Every session pod is kept as the watch shows it
  (``watchedpods``): a pass reads its owner there, not with a GET.
- An image change: its AgentMigration made at once (``sessions.migrate_on_image_change``,
  two requests), before the spec change's pass.

Errors never crash-loop: a session pass that fails sets ``Degraded`` with the reason,
posts a Warning event, counts in ``shadowpod_reconcile_errors_total``, and is tried
again after a wait that doubles with each failure of that object (``backoff``); a
migration daemon that fails says so the same way and raises ``kopf.TemporaryError``
with that object's wait, so that Kopf runs it again then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config
from pydantic import ValidationError

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.errors import ShadowpodError
from shadowpod.kube import cleanup, migrations, names, positions, rollouts, sessions, wakes
from shadowpod.kube.admission import AdmissionQueue
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.config import OperatorConfig
from shadowpod.kube.context import OperatorContext, backoff_key
from shadowpod.kube.metrics import OperatorMetrics
from shadowpod.kube.models.v1alpha1 import GROUP, VERSION
from shadowpod.kube.models.v1alpha1.deployment import DEPLOYMENT_LABEL

logger = logging.getLogger("shadowpod.operator")

SESSIONS: Final = (GROUP, VERSION, "agentsessions")
MIGRATIONS: Final = (GROUP, VERSION, "agentmigrations")
DEPLOYMENTS: Final = (GROUP, VERSION, "agentdeployments")
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


@dataclass
class OperatorMemo:
    """The operator's own state, in Kopf's memo (``kopf.operator(memo=...)``): what it
    is given, and what its startup opens. Kopf hands every resource handler a shallow
    copy, so all of them share the one ``context``."""

    config: OperatorConfig
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    resources: AsyncExitStack = field(default_factory=AsyncExitStack)
    started: OperatorContext | None = None
    # The cluster-wide pacing queue, and its loop's task (from startup to cleanup).
    queue: AdmissionQueue | None = None
    admitting: asyncio.Task[None] | None = None
    # One long-poll of the gateway's wake feed, for every session.
    wake_listener: asyncio.Task[None] | None = None
    # One read of every session's position per period, for every session.
    positions_look: asyncio.Task[None] | None = None

    @property
    def context(self) -> OperatorContext:
        if self.started is None:
            raise RuntimeError("the operator's startup handler has not run")
        return self.started


def registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """The operator's handlers, in a registry of their own (tests run several); run it
    with ``memo=OperatorMemo(config, metrics)``."""
    reg = kopf.OperatorRegistry()
    kopf.on.login(registry=reg)(login)
    kopf.on.startup(registry=reg)(startup)
    kopf.on.cleanup(registry=reg)(shutdown)
    kopf.on.resume(*SESSIONS, registry=reg)(session_changed)
    kopf.on.create(*SESSIONS, registry=reg)(session_changed)
    # Before the spec's pass (Kopf runs an object's handlers one at a time, in this
    # order): an image change's AgentMigration is made first, and quickly.
    kopf.on.field(*SESSIONS, field="spec.image", registry=reg)(image_changed)
    kopf.on.update(*SESSIONS, field="spec", registry=reg)(session_changed)
    kopf.timer(
        *SESSIONS,
        interval=config.reconcile_interval_s,
        when=sessions.needs_passes,
        registry=reg,
    )(session_timer)
    kopf.on.event(*SESSIONS, registry=reg)(session_seen)
    kopf.on.delete(*SESSIONS, registry=reg)(session_deleted)
    kopf.daemon(
        *MIGRATIONS,
        cancellation_backoff=CANCELLATION_BACKOFF_S,
        cancellation_timeout=30.0,
        registry=reg,
    )(migration_daemon)
    kopf.on.delete(*MIGRATIONS, registry=reg)(migration_deleted)
    kopf.on.resume(*DEPLOYMENTS, registry=reg)(deployment_changed)
    kopf.on.create(*DEPLOYMENTS, registry=reg)(deployment_changed)
    # Spec, labels and annotations (the plugin's resume and abort are annotations).
    kopf.on.update(*DEPLOYMENTS, registry=reg)(deployment_changed)
    kopf.timer(*DEPLOYMENTS, interval=config.reconcile_interval_s, registry=reg)(deployment_timer)
    kopf.on.delete(*DEPLOYMENTS, optional=True, registry=reg)(deployment_deleted)
    kopf.on.field("", "v1", "nodes", field="spec.unschedulable", registry=reg)(node_cordoned)
    kopf.on.event("", "v1", "pods", labels={names.SESSION_LABEL: kopf.PRESENT}, registry=reg)(
        pod_changed
    )
    return reg


async def login(memo: OperatorMemo, **_: Any) -> kopf.ConnectionInfo:
    kubeconfig = memo.config.kubeconfig
    return await connection_info(None if kubeconfig is None else str(kubeconfig))


async def startup(memo: OperatorMemo, settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)
    config = memo.config
    kubeconfig = None if config.kubeconfig is None else str(config.kubeconfig)
    api = await memo.resources.enter_async_context(await api_client(kubeconfig))
    http = await memo.resources.enter_async_context(aiohttp.ClientSession())
    admin = await memo.resources.enter_async_context(
        GatewayClient(config.gateway_url, config.control_token)
    )
    memo.started = OperatorContext(KubeApi(api), admin, http, config, memo.metrics)
    memo.metrics.count_requests(lambda: memo.context.api.requests, lambda: admin.requests)
    memo.metrics.max_concurrent_migrations.set(config.max_concurrent_migrations)
    memo.queue = AdmissionQueue(memo.started)
    memo.admitting = asyncio.create_task(memo.queue.run())
    memo.wake_listener = asyncio.create_task(wakes.listen(memo.started), name="wake-listener")
    memo.positions_look = asyncio.create_task(positions.run(memo.started), name="positions")


async def shutdown(memo: OperatorMemo, **_: Any) -> None:
    for task in (memo.admitting, memo.wake_listener, memo.positions_look):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await memo.resources.aclose()


async def session_changed(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    await _session_pass(memo, dict(body))


async def image_changed(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    await sessions.migrate_on_image_change(memo.context, dict(body))


async def session_timer(body: kopf.Body, memo: OperatorMemo, **kwargs: Any) -> None:
    # Kopf passes timers their `stopped` too (TimerFn's type does not declare it).
    pass_ = _session_pass(memo, dict(body))
    await _unless_stopped(pass_, kwargs["stopped"])


async def _session_pass(memo: OperatorMemo, raw: dict[str, Any]) -> None:
    """A session's pass; when its owner started or stopped serving and it follows an
    AgentDeployment, that rollout's pass too: the rollout completes (or goes on) when
    its moved sessions serve again, not at its next timer."""
    status = raw.get("status") or {}
    was = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    serving = await sessions.reconcile_and_patch(memo.context, raw)
    deployment = ((raw.get("spec") or {}).get("deploymentRef") or {}).get("name")
    if deployment and serving is not None and serving != was:
        await rollouts.reconcile_named(memo.context, raw["metadata"]["namespace"], deployment)


async def session_seen(body: kopf.Body, type: str | None, memo: OperatorMemo, **_: Any) -> None:
    sessions.watched(memo.context, body, gone=type == "DELETED")


async def session_deleted(body: kopf.Body, retry: int, memo: OperatorMemo, **_: Any) -> None:
    raw: dict[str, Any] = dict(body)
    namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
    async with sessions.lock(memo.context, namespace, name):
        await cleanup.delete_session(memo.context, raw, attempt=retry)
    memo.context.backoff.succeeded(backoff_key("AgentSession", raw))
    memo.context.count_session((namespace, name), None, ready=True)


async def migration_daemon(
    body: kopf.Body, stopped: kopf.DaemonStopped, memo: OperatorMemo, **_: Any
) -> None:
    raw: dict[str, Any] = dict(body)
    ctx = memo.context
    try:
        await migrations.run(ctx, raw, stopped, memo.queue)
    except (ShadowpodError, ValidationError) as exc:
        failure = await ctx.reconcile_failed(raw, "AgentMigration", exc)
        raise kopf.TemporaryError(f"{failure.reason}: {exc}", delay=failure.retry_s) from exc
    ctx.backoff.succeeded(backoff_key("AgentMigration", raw))
    if not stopped:
        await _migration_ended(raw, memo)


async def _migration_ended(raw: dict[str, Any], memo: OperatorMemo) -> None:
    """A slot is free, and a rollout may take its next step: both looked at now."""
    if memo.queue is not None:
        memo.queue.poke()
    deployment = (raw["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL)
    if deployment:
        await rollouts.reconcile_named(memo.context, raw["metadata"]["namespace"], deployment)


async def migration_deleted(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    """A cancel: rolled back (or finished, past the cutover) before the finalizer goes."""
    await migrations.cancel(memo.context, dict(body))
    if memo.queue is not None:
        memo.queue.poke()


async def deployment_changed(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    meta = body["metadata"]
    await rollouts.reconcile_named(memo.context, meta["namespace"], meta["name"])


async def deployment_timer(body: kopf.Body, memo: OperatorMemo, **kwargs: Any) -> None:
    meta = body["metadata"]
    pass_ = rollouts.reconcile_named(memo.context, meta["namespace"], meta["name"])
    await _unless_stopped(pass_, kwargs["stopped"])


async def deployment_deleted(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    """Its sessions stay as they are, on their versions; its queued moves finish."""
    rollouts.forget(memo.context, body["metadata"]["namespace"], body["metadata"]["name"])


async def node_cordoned(name: str, new: Any, memo: OperatorMemo, **_: Any) -> None:
    if not new:
        return
    logger.info("node %s is cordoned: its sessions move off it", name, extra={"node": name})
    await cleanup.reconcile_sessions_on(memo.context, name)


async def pod_changed(body: kopf.Body, type: str | None, memo: OperatorMemo, **_: Any) -> None:
    """An owner pod that became ready, stopped being ready or went: its session is
    looked at now, not at its next timer."""
    ctx = memo.context
    ctx.watched_pods.seen(body, gone=type == "DELETED")  # type None: listed at start
    labels = body.get("metadata", {}).get("labels", {})
    if labels.get(names.ROLE_LABEL) != names.OWNER_ROLE or type is None:
        return
    namespace = body["metadata"]["namespace"]
    session = await ctx.api.get(namespaced("agentsessions", namespace, labels[names.SESSION_LABEL]))
    if session is None:
        return
    status = session.get("status") or {}
    ready = sessions.pod_ready(dict(body)) and type != "DELETED"
    was_ready = status.get("phase") == "Running"
    if ready != was_ready or status.get("ownerPod") != body["metadata"]["name"]:
        await _session_pass(memo, session)


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
