"""Shadows: the whole journal from a seq, as JSON pages (catch-up) or a stream (tail)."""

from __future__ import annotations

from aiohttp import web

from shadowpod.gateway.context import float_query, gateway, int_query, session_of
from shadowpod.gateway.routes.client import read_page
from shadowpod.gateway.streams import open_stream, pump, resume_point
from shadowpod.journal import codec

routes = web.RouteTableDef()


@routes.get("/v1/sessions/{session}/journal", name="get_journal")
async def get_journal(request: web.Request) -> web.Response:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    after = int_query(request, "after", 0)
    limit = min(int_query(request, "limit", 1000, minimum=1), gw.config.max_page)
    wait_s = float_query(request, "wait", 0.0, maximum=gw.config.max_wait_s)
    # The entries come encoded (by SQLite's JSON functions, for pages from the
    # database): a catch-up page holds thousands of entries, and building and
    # re-encoding an object for each cost more than reading them. Timestamps are UTC
    # with a "Z" (RFC 3339; a zero fraction of a second may be left out).
    array = await gw.store.read_json(session, after, limit)
    if array == b"[]" and wait_s > 0:
        array = codec.entries_json(await read_page(gw.store, session, after, limit, wait_s))
    head = await gw.store.head(session)
    gw.metrics.shadow_lag.observe(max(0, head - after))
    body = b'{"entries":' + array + b',"head":' + str(head).encode() + b"}"
    return web.Response(body=body, content_type="application/json")


@routes.get("/v1/sessions/{session}/journal/stream", name="stream_journal")
async def stream_journal(request: web.Request) -> web.StreamResponse:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    after = resume_point(request)
    await gw.store.read(session, after, 1)  # 404 or 410 before the stream starts, not inside it
    gw.metrics.shadow_lag.observe(max(0, await gw.store.head(session) - after))
    async with open_stream(gw, request, "shadow") as sse:
        await pump(gw, request, sse, gw.store.follow_runs(session, after))
    return sse
