"""Control (operator, migration engine): sessions, ownership, the ExchangeFence."""

from __future__ import annotations

from aiohttp import web

from shadowpod.api.models import (
    CreateSession,
    FenceRequest,
    FenceResult,
    ForkFrom,
    OwnerCredential,
    OwnerCredentialRequest,
    OwnershipChange,
    RestoreSession,
    RetentionApplied,
    RetentionPolicy,
    SessionCreated,
    SessionPosition,
    SessionPositions,
    SessionRestored,
    SessionSummary,
    SnapshotRequest,
    SnapshotRequested,
    UnfenceRequest,
)
from shadowpod.domain.entries import NewEntry, format_ts
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.domain.payloads import (
    ControlEvent,
    ControlPayload,
    CredentialPayload,
    SchedulePayload,
)
from shadowpod.gateway.context import (
    Gateway,
    gateway,
    invalid_value,
    json_response,
    parse_int,
    session_of,
)
from shadowpod.gateway.errors import ApiError, parse_body, read_body, read_raw_body
from shadowpod.journal.errors import EpochConflict
from shadowpod.journal.store import ForkPoint
from shadowpod.sessions import retention
from shadowpod.sessions.deletion import (
    DELETE_AFTER_META,
    DELETED_AT_META,
    MAX_KEEP_S,
    deletion_of,
)
from shadowpod.sessions.fence import FenceTimeout
from shadowpod.sessions.tokens import (
    AGENT_TOKEN_META,
    OWNER_KEY_META,
    new_owner_key,
    new_token,
    owner_credential,
    token_hash,
)

routes = web.RouteTableDef()


@routes.post("/v1/sessions", name="create_session")
async def create_session(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    body = await read_body(request, CreateSession)
    for reserved in (AGENT_TOKEN_META, OWNER_KEY_META, DELETED_AT_META, DELETE_AFTER_META):
        if reserved in body.meta:
            raise ApiError(400, "InvalidRequest", f"meta key {reserved!r} is reserved")
    token: str | None = None
    digest = body.agent_token_sha256
    if digest is None:
        token = new_token()
        digest = token_hash(token)
    meta = {**body.meta, AGENT_TOKEN_META: digest}
    if body.owner_key is not None:
        meta[OWNER_KEY_META] = body.owner_key
    elif body.owner_credentials:
        meta[OWNER_KEY_META] = new_owner_key()
    fork = None if body.fork_from is None else await _fork_point(gw, body.fork_from)
    info = await gw.store.create_session(body.session, meta=meta, fork=fork)
    # A fork's journal holds its parent's credentials and schedules already, under the
    # same ids: its own (the ones it was made with) are journaled after the fork point
    # under ids of its own, and take over from the parent's.
    prefix = "" if fork is None else f"fork:{body.session}:"
    entries = [
        NewEntry.of(
            CredentialPayload(name=c.name, secret_ref=c.secret_ref),
            id=f"{prefix}credential:{c.name}",
        )
        for c in body.credentials
    ]
    entries += [
        NewEntry.of(
            SchedulePayload.setting(
                s.schedule_id, every_s=s.every_s, content=s.content, wake=s.wake
            ),
            id=f"{prefix}schedule-set:{s.schedule_id}",
        )
        for s in body.schedules
    ]
    if entries:
        await gw.store.append(body.session, entries)
        gw.metrics.appends.labels(source="control").inc(len(entries))
    if body.schedules or fork is not None:
        gw.firer.touch(body.session)
    created = SessionCreated(
        session=body.session, agent_token=token, fork_of=info.fork_of, fork_seq=info.fork_seq
    )
    return json_response(created.model_dump(mode="json", exclude_none=True), status=201)


async def _fork_point(gw: Gateway, fork_from: ForkFrom) -> ForkPoint:
    """The seq a fork starts at: the one asked for, or the watermark of the snapshot
    asked for (which must exist: the fork starts from it)."""
    if fork_from.seq is not None:
        return ForkPoint(fork_from.session, fork_from.seq)
    assert fork_from.snapshot is not None
    snapshot = await gw.store.get_snapshot(fork_from.session, fork_from.snapshot)
    return ForkPoint(fork_from.session, snapshot.info.watermark)


@routes.post("/v1/sessions/{session}/owner-credentials", name="mint_owner_credential")
async def mint_owner_credential(request: web.Request) -> web.Response:
    """The owner credential of an instance, for whoever starts it (control token)."""
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, OwnerCredentialRequest)
    info = await gw.store.get_session(session)
    owner_key = info.meta.get(OWNER_KEY_META)
    if not owner_key:
        raise ApiError(
            409,
            "NoOwnerCredentials",
            f"session {session!r} was made without owner credentials: its owners write "
            "with the agent token and their epoch alone",
        )
    credential = owner_credential(owner_key, session, body.instance)
    return json_response(OwnerCredential(instance=body.instance, credential=credential))


@routes.get("/v1/sessions", name="list_sessions")
async def list_sessions(request: web.Request) -> web.Response:
    """Every session; with ``deleted=true``, only the ones deleted and kept for a while."""
    gw = gateway(request)
    gw.auth.control(request)
    only_deleted = _bool_query(request, "deleted")
    summaries = []
    for info in await gw.store.list_sessions():
        mark = deletion_of(info)
        if only_deleted and mark is None:
            continue
        summaries.append(
            SessionSummary(
                session=info.session,
                head=info.head,
                created=format_ts(info.created),
                deleted_at=None if mark is None else format_ts(mark.deleted_at),
                delete_after=None if mark is None else format_ts(mark.delete_after),
            ).model_dump(exclude_none=True)
        )
    return json_response(summaries)


def _bool_query(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false")
    if raw not in ("true", "false"):
        raise invalid_value(name, f"must be true or false, got {raw[:40]!r}")
    return raw == "true"


@routes.get("/v1/positions", name="get_positions")
async def get_positions(request: web.Request) -> web.Response:
    """Every session's head, acked turn and ownership, in one read: the operator's
    periodic look costs one request whatever the number of sessions."""
    gw = gateway(request)
    gw.auth.control(request)
    positions = await gw.store.positions()
    return json_response(
        SessionPositions(
            sessions=[
                SessionPosition(
                    session=p.session,
                    head=p.head,
                    acked=p.acked,
                    epoch=p.epoch,
                    fence=FenceState(p.fence),
                )
                for p in positions
            ]
        )
    )


@routes.delete("/v1/sessions/{session}", name="delete_session")
async def delete_session(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    raw = request.query.get("keepFor")
    if raw is None:
        await gw.store.delete_session(session)
    else:
        # Kept, marked deleted: its journal stays readable (control token) until the
        # sweeper deletes it, keep_for seconds from now (a parent: once its forks go).
        await gw.deletions.mark(session, parse_int(raw, "keepFor", maximum=MAX_KEEP_S))
    gw.forget(session)
    return web.Response(status=204)


@routes.post("/v1/sessions/{session}/restore", name="restore_session")
async def restore_session(request: web.Request) -> web.Response:
    """Take a deletion mark off: the session is in use again (an AgentSession of its
    name was created again), with the agent token and owner key given, if any."""
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, RestoreSession)
    mark = await gw.deletions.restore(session)
    keys = {AGENT_TOKEN_META: body.agent_token_sha256, OWNER_KEY_META: body.owner_key}
    changes = {key: value for key, value in keys.items() if value is not None}
    if changes:
        await gw.store.update_meta(session, changes)
        gw.auth.forget(session)
    return json_response(SessionRestored(session=session, was_deleted=mark is not None))


@routes.put("/v1/sessions/{session}/retention", name="put_retention")
async def put_retention(request: web.Request) -> web.Response:
    """Set the session's retention policy and apply it now; the gateway applies it
    again after every snapshot stored."""
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, RetentionPolicy)
    done = await retention.set_policy(gw.store, session, body.keep_snapshots)
    applied = RetentionApplied(keep_snapshots=body.keep_snapshots, **done.model_dump())
    return json_response(applied)


@routes.get("/v1/sessions/{session}/ownership", name="get_ownership")
async def get_ownership(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    return json_response(await gw.store.get_ownership(session_of(request)))


@routes.put("/v1/sessions/{session}/ownership", name="put_ownership")
async def put_ownership(request: web.Request) -> web.Response:
    """Hand the session to an owner by compare-and-set (first owner, or recovery)."""
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, OwnershipChange)
    gate = await gw.gates.get(session)
    async with gate.lock:  # never while an ExchangeFence of this session runs
        changed = await gw.store.compare_and_set_ownership(
            session,
            body.expect_epoch,
            Ownership(epoch=body.epoch, owner=body.owner, fence=FenceState.OPEN),
        )
        await gw.gates.epoch_changed(gate, changed)
    return json_response(changed)


@routes.post("/v1/sessions/{session}/fence", name="fence")
async def fence(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, FenceRequest)
    try:
        outcome = await gw.fence.exchange(
            session,
            expect_epoch=body.expect_epoch,
            new_owner=body.new_owner,
            timeout_s=body.timeout_s,
        )
    except FenceTimeout as exc:
        gw.metrics.fences.labels(result="timeout").inc()
        gw.metrics.fence_wait.observe(exc.waited_s)
        raise
    except EpochConflict:
        gw.metrics.fences.labels(result="conflict").inc()
        raise
    gw.metrics.fences.labels(result="committed").inc()
    gw.metrics.fence_wait.observe(outcome.waited_s)
    result = FenceResult(
        epoch=outcome.epoch,
        fence_seq=outcome.fence_seq,
        waited_ms=round(outcome.waited_s * 1000, 3),
        delivered_through=outcome.released_through,
        acked=outcome.acked,
    )
    return json_response(result)


@routes.post("/v1/sessions/{session}/unfence", name="unfence")
async def unfence(request: web.Request) -> web.Response:
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    body = await read_body(request, UnfenceRequest)
    return json_response(await gw.fence.unfence(session, expect_epoch=body.expect_epoch))


@routes.post("/v1/sessions/{session}/snapshot-requests", name="request_snapshot")
async def request_snapshot(request: web.Request) -> web.Response:
    """Ask the owner for a snapshot while it serves: the request is a journal entry."""
    gw = gateway(request)
    gw.auth.control(request)
    session = session_of(request)
    raw = await read_raw_body(request)
    if raw.strip():  # no body, or one with nothing in it: the request takes no fields
        parse_body(raw, SnapshotRequest)
    [appended] = await gw.store.append(
        session, [NewEntry.of(ControlPayload(event=ControlEvent.SNAPSHOT_REQUEST))]
    )
    return json_response(SnapshotRequested(seq=appended.seq), status=202)
