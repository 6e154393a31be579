"""Assemble and run the gateway application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator

from aiohttp import web

from shadowpod.gateway.auth import Authenticator
from shadowpod.gateway.config import GatewayConfig
from shadowpod.gateway.context import GATEWAY, Gateway
from shadowpod.gateway.errors import LIMITS, Handler, Limits, error_middleware
from shadowpod.gateway.metrics import GatewayMetrics
from shadowpod.gateway.routes import channel, client, control, ops, owner, shadow, snapshots
from shadowpod.journal.factory import store_from_url
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.fence import ExchangeFence
from shadowpod.sessions.gates import SessionGates
from shadowpod.sessions.schedules import ScheduleFirer

logger = logging.getLogger(__name__)
ROUTE_TABLES = (
    client.routes,
    owner.routes,
    channel.routes,
    shadow.routes,
    snapshots.routes,
    control.routes,
    ops.routes,
)


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    request.app[GATEWAY].metrics.requests.labels(route=route, code=str(response.status)).inc()
    return response


def make_app(config: GatewayConfig, store: JournalStore | None = None) -> web.Application:
    store = store or store_from_url(config.journal_url)
    metrics = GatewayMetrics()
    gates = SessionGates(store, on_pause=metrics.fence_pause.observe, window=config.delivery_window)
    gw = Gateway(
        config=config,
        store=store,
        auth=Authenticator(store, config.control_token_hashes, config.client_token_hashes),
        gates=gates,
        fence=ExchangeFence(store, gates),
        firer=ScheduleFirer(store, on_fire=metrics.schedule_fires.inc),
        metrics=metrics,
    )
    app = web.Application(
        # Each route checks its own limit (read_body); this is the largest of them.
        client_max_size=max(config.max_body_bytes, config.max_snapshot_bytes),
        middlewares=[count_requests, error_middleware],
    )
    app[GATEWAY] = gw
    app[LIMITS] = Limits(
        max_body_bytes=config.max_body_bytes, max_snapshot_bytes=config.max_snapshot_bytes
    )
    for table in ROUTE_TABLES:
        app.add_routes(table)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_end_streams)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    await gw.store.open()
    firing: asyncio.Task[None] | None = None
    if gw.config.schedules:
        await gw.firer.load(s.session for s in await gw.store.list_sessions())
        firing = asyncio.create_task(gw.firer.run(), name="schedule-firer")
    logger.info("gateway ready", extra={"journal": _redacted(gw.config.journal_url)})
    try:
        yield
    finally:
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
    runner = web.AppRunner(make_app(config), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    logger.info("gateway listening", extra={"address": f"{config.host}:{config.port}"})
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
