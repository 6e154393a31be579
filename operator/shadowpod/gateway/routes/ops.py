"""Operations: health, readiness and Prometheus metrics."""

from __future__ import annotations

import contextlib
import time
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shadowpod.gateway.context import Gateway, gateway, json_response
from shadowpod.gateway.errors import RETRY_AFTER_S, STORE_HEALTH
from shadowpod.journal.errors import SessionNotFound, StoreFull, StoreUnavailable
from shadowpod.sessions import retention

routes = web.RouteTableDef()


@routes.get("/healthz", name="healthz")
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@routes.get("/readyz", name="readyz")
async def readyz(request: web.Request) -> web.Response:
    """Ready when the journal store answers, and has not said lately that it is full
    (reads still work on a full disk; writes do not)."""
    try:
        with contextlib.suppress(SessionNotFound):
            await gateway(request).store.head("readyz.probe")
        if request.app[STORE_HEALTH].is_full():
            raise StoreFull("it refused a write in the last seconds")
    except StoreUnavailable as exc:
        response = json_response({"status": "unavailable", "reason": str(exc)}, status=503)
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    return json_response({"status": "ready"})


@routes.get("/metrics", name="metrics")
async def metrics(request: web.Request) -> web.Response:
    gw = gateway(request)
    await _journal_sizes(gw)
    body = generate_latest(gw.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# Journal sizes are read from the store at most this often (one pass over the session
# rows), however often Prometheus scrapes.
JOURNAL_SIZES_EVERY_S: Final = 15.0


async def _journal_sizes(gw: Gateway) -> None:
    """Per namespace: the entries its sessions' own journals hold, and how many there
    are. A store that does not answer leaves the last figures."""
    now = time.monotonic()
    if now - gw.metrics.journal_sizes_read_at < JOURNAL_SIZES_EVERY_S:
        return
    gw.metrics.journal_sizes_read_at = now
    try:
        sessions = await gw.store.list_sessions()
    except StoreUnavailable:
        return
    entries: dict[str, int] = {}
    counted: dict[str, int] = {}
    for info in sessions:
        namespace = info.meta.get("namespace", "")
        own = retention.own_entries(info.head, info.truncated_through, info.fork_seq)
        entries[namespace] = entries.get(namespace, 0) + own
        counted[namespace] = counted.get(namespace, 0) + 1
    gw.metrics.journal_entries.clear()
    gw.metrics.journal_sessions.clear()
    for namespace, total in entries.items():
        gw.metrics.journal_entries.labels(session_namespace=namespace).set(total)
        gw.metrics.journal_sessions.labels(session_namespace=namespace).set(counted[namespace])
