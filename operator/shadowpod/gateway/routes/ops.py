"""Operations: health, readiness and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shadowpod.gateway.context import gateway, json_response
from shadowpod.journal.errors import SessionNotFound, StoreUnavailable

routes = web.RouteTableDef()


@routes.get("/healthz", name="healthz")
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@routes.get("/readyz", name="readyz")
async def readyz(request: web.Request) -> web.Response:
    """Ready when the journal store answers."""
    try:
        await gateway(request).store.head("readyz.probe")
    except SessionNotFound:
        pass
    except StoreUnavailable as exc:
        return json_response({"status": "unavailable", "reason": str(exc)}, status=503)
    return json_response({"status": "ready"})


@routes.get("/metrics", name="metrics")
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(gateway(request).metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
