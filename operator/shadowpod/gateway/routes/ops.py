"""Operations: health, readiness and Prometheus metrics."""

from __future__ import annotations

import contextlib

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shadowpod.gateway.context import gateway, json_response
from shadowpod.gateway.errors import RETRY_AFTER_S, STORE_HEALTH
from shadowpod.journal.errors import SessionNotFound, StoreFull, StoreUnavailable

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
    body = generate_latest(gateway(request).metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
