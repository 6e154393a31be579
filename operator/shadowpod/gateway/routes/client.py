"""Clients: post messages, read events (JSON long-poll or SSE), session status."""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web
from pydantic import JsonValue

from shadowpod.api.models import Accepted, PostMessage, SessionStatus
from shadowpod.domain.entries import JournalEntry, NewEntry, new_entry_id
from shadowpod.domain.payloads import EntryKind
from shadowpod.gateway.context import (
    float_query,
    gateway,
    int_query,
    json_response,
    session_of,
)
from shadowpod.gateway.errors import read_body
from shadowpod.gateway.streams import EntryFilter, open_stream, pump, resume_point
from shadowpod.journal.store import JournalStore, Writer
from shadowpod.sessions import retention

routes = web.RouteTableDef()
# When a client whose message woke a session is told to look for the answer.
WAKE_RETRY_AFTER_S: Final = 5


@routes.post("/v1/sessions/{session}/messages", name="post_message")
async def post_message(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.client(request)
    session = session_of(request)
    body = await read_body(request, PostMessage)
    wait_s = float_query(request, "wait", 0.0, maximum=gw.config.max_wait_s)
    payload: dict[str, JsonValue] = {"role": body.role, "content": body.content}
    if body.meta:
        payload["meta"] = body.meta
    entry = NewEntry(id=body.id or new_entry_id(), kind=EntryKind.MESSAGE, payload=payload)
    [appended] = await gw.store.append(session, [entry], writer=Writer.CLIENT)
    source = "client"
    gw.metrics.appends.labels(source=source).inc(0 if appended.duplicate else 1)
    if appended.duplicate:
        gw.metrics.duplicates.labels(source=source).inc()
    # A suspended session wakes on a message: the caller may wait (``wait``, seconds)
    # for its owner to be up; else it is told when to look again.
    waking = await gw.lifecycle.wake(session)
    if waking:
        waking = not (wait_s > 0 and await gw.lifecycle.wait_resumed(session, wait_s))
    accepted = Accepted(
        session=session,
        seq=appended.seq,
        id=appended.id,
        duplicate=appended.duplicate,
        waking=waking,
    )
    response = json_response(accepted, status=202)
    if waking:
        response.headers["Retry-After"] = str(WAKE_RETRY_AFTER_S)
    return response


def kinds_filter(request: web.Request) -> EntryFilter | None:
    raw = request.query.get("kinds")
    if not raw:
        return None
    kinds = frozenset(k.strip() for k in raw.split(",") if k.strip())
    return lambda entry: entry.kind in kinds


async def read_page(
    store: JournalStore, session: str, after: int, limit: int, wait_s: float
) -> list[JournalEntry]:
    """Entries after ``after``; when there are none, wait up to ``wait_s`` for some."""
    entries = await store.read(session, after, limit)
    if entries or wait_s <= 0:
        return entries
    try:
        async with asyncio.timeout(wait_s):
            async for batch in store.follow_batches(session, after):
                return list(batch[:limit])
    except TimeoutError:
        pass
    return []


@routes.get("/v1/sessions/{session}/events", name="get_events")
async def get_events(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.client(request)
    session = session_of(request)
    after = int_query(request, "after", 0)
    limit = min(int_query(request, "limit", 1000, minimum=1), gw.config.max_page)
    wait_s = float_query(request, "wait", 0.0, maximum=gw.config.max_wait_s)
    keep = kinds_filter(request)
    entries = await read_page(gw.store, session, after, limit, wait_s)
    head = await gw.store.head(session)
    events = [e.to_json() for e in entries if keep is None or keep(e)]
    next_after = entries[-1].seq if entries else after
    return json_response({"events": events, "head": head, "next_after": next_after})


@routes.get("/v1/sessions/{session}/events/stream", name="stream_events")
async def stream_events(request: web.Request) -> web.StreamResponse:
    gw = gateway(request)
    gw.auth.client(request)
    session = session_of(request)
    after = resume_point(request)
    await gw.store.read(session, after, 1)  # 404 or 410 before the stream starts, not inside it
    async with open_stream(gw, request, "client") as sse:
        await pump(gw, request, sse, gw.store.follow_runs(session, after), kinds_filter(request))
    return sse


@routes.get("/v1/sessions/{session}", name="get_session")
async def get_session(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.client(request)
    session = session_of(request)
    info = await gw.store.get_session(session)
    ownership = await gw.store.get_ownership(session)
    acks = await gw.store.acks(session)
    snapshots = await gw.store.list_snapshots(session)
    gate = gw.gates.known(session)
    pause = (
        None if gate is None or gate.last_fence_pause_s is None else gate.last_fence_pause_s * 1000
    )
    acked = max(acks.values(), default=0)
    status = SessionStatus(
        session=session,
        head=info.head,
        truncated_through=info.truncated_through,
        ownership=ownership,
        acks=acks,
        acked=acked,
        delivered_through=acked if gate is None else gate.released_through,
        outstanding=0 if gate is None else gate.outstanding,
        last_fence_pause_ms=pause,
        fence_pause_pending=gate is not None and gate.pause_pending,
        latest_snapshot=snapshots[-1].watermark if snapshots else None,
        journal_entries=retention.own_entries(info.head, info.truncated_through, info.fork_seq),
        fork_of=info.fork_of,
        fork_seq=info.fork_seq,
    )
    return json_response(status)
