"""Lifecycle (operator): suspend, resume, the wake feed; a session's history and activity."""

from __future__ import annotations

from aiohttp import web

from shadowpod.api.models import (
    HistoryEvent,
    ResumeRequest,
    SessionActivity,
    SessionHistory,
    SuspendRequest,
    SuspendResult,
    WakeOut,
    WakesPage,
)
from shadowpod.domain.entries import format_ts
from shadowpod.gateway.context import float_query, gateway, int_query, json_response, session_of
from shadowpod.gateway.errors import read_body
from shadowpod.sessions import history as told
from shadowpod.sessions.fence import FenceTimeout

routes = web.RouteTableDef()


@routes.post("/v1/sessions/{session}/suspend", name="suspend")
async def suspend(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, SuspendRequest)
    try:
        outcome, marker = await gw.lifecycle.suspend(
            session,
            expect_epoch=body.expect_epoch,
            next_owner=body.next_owner,
            timeout_s=body.timeout_s,
            reason=body.reason,
        )
    except FenceTimeout:
        gw.metrics.fences.labels(result="timeout").inc()
        raise
    gw.metrics.fences.labels(result="committed").inc()
    result = SuspendResult(
        epoch=outcome.epoch,
        fence_seq=outcome.fence_seq,
        suspend_seq=marker,
        waited_ms=round(outcome.waited_s * 1000, 3),
    )
    return json_response(result)


@routes.post("/v1/sessions/{session}/resume", name="resume")
async def resume(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, ResumeRequest)
    return json_response(await gw.lifecycle.resume(session, expect_epoch=body.expect_epoch))


@routes.get("/v1/wakes", name="get_wakes")
async def get_wakes(request: web.Request) -> web.Response:
    """Sessions a message asked to wake, after ``after``: one long-poll for them all."""
    gw = gateway(request)
    gw.auth.control(request)
    after = int_query(request, "after", 0)
    wait_s = float_query(request, "wait", 0.0, maximum=gw.config.max_wait_s)
    feed = gw.lifecycle.feed
    wakes = await feed.after(after, wait_s)
    page = WakesPage(
        wakes=[
            WakeOut(
                cursor=w.cursor, session=w.session, epoch=w.epoch, seq=w.seq, at=format_ts(w.at)
            )
            for w in wakes
        ],
        cursor=wakes[-1].cursor if wakes else feed.cursor,
    )
    return json_response(page)


@routes.get("/v1/sessions/{session}/history", name="get_history")
async def get_history(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.client(request)
    session = session_of(request)
    after = int_query(request, "after", 0)
    items, last = await told.history(gw.store, session, after=after)
    events = [
        HistoryEvent(
            seq=i.seq,
            at=format_ts(i.at),
            event=i.event,
            epoch=i.epoch,
            owner=i.owner,
            reason=i.reason,
            detail=i.detail,
        )
        for i in items
    ]
    head = await gw.store.head(session)
    return json_response(SessionHistory(session=session, head=head, events=events, next_after=last))


@routes.get("/v1/sessions/{session}/activity", name="get_activity")
async def get_activity(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    seen = await told.activity(gw.store, session)
    ownership = await gw.store.get_ownership(session)
    answer = SessionActivity(
        session=session,
        delivery=ownership.fence.value,
        last_message_seq=seen.last_message_seq,
        last_message_at=None if seen.last_message_at is None else format_ts(seen.last_message_at),
        quiet_since=format_ts(seen.quiet_since),
    )
    return json_response(answer)
