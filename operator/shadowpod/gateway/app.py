"""Assemble and run the gateway application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from functools import partial
from typing import Any, Final

from aiohttp import web

from shadowpod.gateway.auth import Authenticator
from shadowpod.gateway.config import GatewayConfig
from shadowpod.gateway.context import GATEWAY, Gateway
from shadowpod.gateway.errors import (
    CONTROL_BODY_BYTES,
    LIMITS,
    STORE_HEALTH,
    Handler,
    Limits,
    StoreHealth,
    body_limits,
    error_middleware,
)
from shadowpod.gateway.metrics import GatewayMetrics
from shadowpod.gateway.placement import PLACEMENT, Placement, placement_middleware
from shadowpod.gateway.routes import (
    channel,
    client,
    control,
    lifecycle,
    ops,
    owner,
    shadow,
    snapshots,
)
from shadowpod.gateway.server import GatewayRunner
from shadowpod.journal.factory import store_from_url
from shadowpod.journal.leases import SessionLeases
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.deletion import DeletedSessions
from shadowpod.sessions.fence import ExchangeFence
from shadowpod.sessions.gates import SessionGates
from shadowpod.sessions.lifecycle import SessionLifecycle, WakeFeed
from shadowpod.sessions.schedules import ScheduleFirer

logger = logging.getLogger(__name__)
ROUTE_TABLES = (
    client.routes,
    owner.routes,
    channel.routes,
    shadow.routes,
    snapshots.routes,
    control.routes,
    lifecycle.routes,
    ops.routes,
)


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    request.app[GATEWAY].metrics.requests.labels(route=route, code=str(response.status)).inc()
    return response


# Routes that take a body, and how large a one. Every other route takes none.
SNAPSHOT_BODIES: Final = frozenset({"put_snapshot"})
LARGE_BODIES: Final = frozenset(
    {"post_message", "append_journal", "create_session", "post_drained"}
)
CONTROL_BODIES: Final = frozenset(
    {"post_ack", "put_ownership", "fence", "unfence", "request_snapshot", "mint_owner_credential"}
)
LIFECYCLE_BODIES: Final = frozenset({"suspend", "resume"})


def body_limits_by_route(config: GatewayConfig) -> dict[str, int]:
    limits: dict[str, int] = {}
    for table in ROUTE_TABLES:
        for route in table:
            assert isinstance(route, web.RouteDef) and route.kwargs.get("name")
            name = route.kwargs["name"]
            if name in SNAPSHOT_BODIES:
                limits[name] = config.max_snapshot_bytes
            elif name in LARGE_BODIES:
                limits[name] = config.max_body_bytes
            elif name in CONTROL_BODIES | LIFECYCLE_BODIES:
                limits[name] = min(CONTROL_BODY_BYTES, config.max_body_bytes)
            else:
                limits[name] = 0
    return limits


def make_runner(app: web.Application, **kwargs: Any) -> GatewayRunner:
    """The runner that serves ``app`` with the gateway's connection limits."""
    config = app[GATEWAY].config
    return GatewayRunner(
        app,
        max_connections_per_peer=config.max_connections_per_peer,
        header_timeout_s=config.header_timeout_s,
        **kwargs,
    )


def make_app(config: GatewayConfig, store: JournalStore | None = None) -> web.Application:
    store = store or store_from_url(config.journal_url)
    metrics = GatewayMetrics()
    gates = SessionGates(store, on_pause=metrics.fence_pause.observe, window=config.delivery_window)
    fence = ExchangeFence(store, gates)
    lifecycle = SessionLifecycle(store, gates, fence, WakeFeed())
    # A waking schedule's fire asks for a wake the way a client's message does.
    wake_on_fire = partial(lifecycle.wake, reason="schedule")
    gw = Gateway(
        config=config,
        store=store,
        auth=Authenticator(store, config.control_token_hashes, config.client_token_hashes),
        gates=gates,
        fence=fence,
        firer=ScheduleFirer(
            store,
            on_fire=metrics.schedule_fires.inc,
            wake=wake_on_fire,
        ),
        metrics=metrics,
        lifecycle=lifecycle,
        deletions=DeletedSessions(store),
    )
    gw.deletions.on_deleted = gw.forget
    app = web.Application(
        # Routes stream their bodies with their own limits (read_raw_body); this only
        # bounds a body read whole by aiohttp, which the gateway does not do.
        client_max_size=config.max_body_bytes,
        middlewares=[count_requests, error_middleware, placement_middleware, body_limits],
    )
    placement = _placement(gw)
    if placement is not None:
        app[PLACEMENT] = placement
        gw.deletions.right = placement  # only a session's lease holder sweeps it
        # Only the lease holder fires a session's schedules.
        gw.firer = ScheduleFirer(
            store,
            on_fire=metrics.schedule_fires.inc,
            wake=wake_on_fire,
            right=placement,
            recheck_s=config.lease_ttl_s / 4,
            rediscover_s=config.lease_ttl_s,
        )
    app[GATEWAY] = gw
    app[STORE_HEALTH] = StoreHealth()
    app[LIMITS] = Limits(
        max_body_bytes=config.max_body_bytes,
        max_snapshot_bytes=config.max_snapshot_bytes,
        body_timeout_s=config.body_timeout_s,
        body_idle_timeout_s=config.body_idle_timeout_s,
        routes=body_limits_by_route(config),
    )
    for table in ROUTE_TABLES:
        app.add_routes(table)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_end_streams)
    return app


def _placement(gw: Gateway) -> Placement | None:
    """Leases, when replicas share a PostgreSQL journal and this one says where it is."""
    leases: SessionLeases | None = getattr(gw.store, "leases", None)
    url = gw.config.advertise_url
    if leases is None or url is None:
        return None

    def lost(session: str) -> None:
        # The new holder rebuilds the gate from the journal; the owner reconnects there.
        gw.gates.forget(session)
        for task in gw.owner_channels.pop(session, set()):
            task.cancel()

    replica = gw.config.replica_id or url
    leases.guard = replica  # the database refuses an epoch change by a replica that lost it

    def quiet(session: str) -> bool:
        # No fence running, nothing released to the owner unacked: a move now makes no
        # fence fail and no turn be redone.
        gate = gw.gates.known(session)
        return gate is None or (not gate.lock.locked() and not gate.outstanding and not gate.fenced)

    placement = Placement(
        leases, replica, url, ttl_s=gw.config.lease_ttl_s, on_lost=lost, quiet=quiet
    )
    gw.serves = placement.holds
    return placement


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    await gw.store.open()
    placement = app.get(PLACEMENT)
    renewing: asyncio.Task[None] | None = None
    if placement is not None:
        await placement.start()
        renewing = asyncio.create_task(placement.run(), name="lease-renewal")
    firing: asyncio.Task[None] | None = None
    if gw.config.schedules:
        await gw.firer.load(s.session for s in await gw.store.list_sessions())
        firing = asyncio.create_task(gw.firer.run(), name="schedule-firer")
    sweeping = asyncio.create_task(
        gw.deletions.run(gw.config.deleted_sweep_s), name="deleted-session-sweeper"
    )
    # Not "ready": the address may still turn out to be taken (serve says ready).
    logger.info("journal open", extra={"journal": _redacted(gw.config.journal_url)})
    try:
        yield
    finally:
        sweeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeping
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        if placement is not None:
            with contextlib.suppress(Exception):  # unreleased, they expire within the ttl
                await placement.hand_over()
            await placement.stop()
        if firing is not None:
            firing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await firing
        await gw.store.close()


async def _end_streams(app: web.Application) -> None:
    """Streams would otherwise hold shutdown until their clients leave."""
    for task in list(app[GATEWAY].streams):
        task.cancel()


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


async def serve(config: GatewayConfig, *, ready: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT, then stop accepting, end streams and close the store."""
    runner = make_runner(make_app(config), shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    logger.info(
        "gateway ready",
        extra={"address": f"{config.host}:{config.port}", "journal": _redacted(config.journal_url)},
    )
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        placement = runner.app.get(PLACEMENT)
        if placement is not None:
            # Hand the sessions over first: requests for them go to other replicas
            # while this one ends its streams.
            with contextlib.suppress(Exception):
                released = await placement.hand_over()
                logger.info("session leases released", extra={"sessions": released})
        await runner.cleanup()
