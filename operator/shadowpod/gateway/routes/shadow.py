"""Shadows: the whole journal from a seq, as JSON pages (catch-up) or a stream (tail)."""

from __future__ import annotations

import orjson
from aiohttp import web

from shadowpod.gateway.context import float_query, gateway, int_query, session_of
from shadowpod.gateway.routes.client import read_page
from shadowpod.gateway.streams import open_stream, pump, resume_point

routes = web.RouteTableDef()


@routes.get("/v1/sessions/{session}/journal", name="get_journal")
async def get_journal(request: web.Request) -> web.Response:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    after = int_query(request, "after", 0)
    limit = min(int_query(request, "limit", 1000, minimum=1), gw.config.max_page)
    wait_s = float_query(request, "wait", 0.0, maximum=gw.config.max_wait_s)
    entries = await read_page(gw.store, session, after, limit, wait_s)
    head = await gw.store.head(session)
    gw.metrics.shadow_lag.observe(max(0, head - after))
    # Encoded by orjson straight from the entries (the shape of ``JournalPage``), not
    # through the model or ``to_json``: a catch-up page holds thousands of entries, and
    # re-validating them cost more than reading them. orjson writes the same UTC
    # timestamps, except that a zero fraction of a second is left out (RFC 3339 either
    # way; every client parses both).
    page = {"entries": entries, "head": head}
    return web.Response(
        body=orjson.dumps(page, option=orjson.OPT_UTC_Z), content_type="application/json"
    )


@routes.get("/v1/sessions/{session}/journal/stream", name="stream_journal")
async def stream_journal(request: web.Request) -> web.StreamResponse:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    after = resume_point(request)
    await gw.store.read(session, after, 1)  # 404 or 410 before the stream starts, not inside it
    gw.metrics.shadow_lag.observe(max(0, await gw.store.head(session) - after))
    async with open_stream(gw, request, "shadow") as sse:
        await pump(sse, gw.store.follow_batches(session, after))
    return sse
