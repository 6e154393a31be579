"""Snapshots: owners store them; shadows, the operator and the engine read them.

A state document is stored and served as the JSON text the owner sent, never parsed
into objects here: a long session's state runs to megabytes, and building (then
re-encoding) its objects held the gateway's GIL for tens of milliseconds per snapshot
— every session on the gateway waited, and sessions snapshotting together stalled it
for hundreds. A snapshot PUT streams: each piece of the body is checked by an
incremental JSON parser and compressed into a temporary file on a thread as it
arrives (``journal.spool``), and the store copies that file in — one 250 MiB snapshot
used to take the gateway past 2.5 GiB. Answers are made by splicing bytes.
"""

from __future__ import annotations

import asyncio
from typing import Final

import orjson
from aiohttp import web

from shadowpod.api.models import (
    SNAPSHOT_SCHEMA_VERSION_HEADER,
    SNAPSHOT_WATERMARK_HEADER,
    FieldError,
    SnapshotInfoOut,
)
from shadowpod.domain.bounds import INT32_MAX, INT64_MAX
from shadowpod.domain.entries import format_ts
from shadowpod.gateway.context import gateway, json_response, required_int_query, session_of
from shadowpod.gateway.errors import ApiError, read_body_pieces
from shadowpod.gateway.routes.owner import check_owner
from shadowpod.journal.errors import SnapshotNotFound
from shadowpod.journal.spool import DocumentRefused, SnapshotSpool
from shadowpod.journal.store import CompressedDocument, Snapshot, SnapshotInfo
from shadowpod.sessions import retention

routes = web.RouteTableDef()
# A body is handed to the spool's thread this much at a time: one hop per piece, and
# what a body holds in memory is about this (plus the connection's read buffer).
SPOOL_PIECE_BYTES: Final = 256 * 1024


def _info(info: SnapshotInfo) -> SnapshotInfoOut:
    return SnapshotInfoOut(
        watermark=info.watermark,
        schema_version=info.schema_version,
        size_bytes=info.size_bytes,
        created=format_ts(info.created),
    )


def _watermark(request: web.Request) -> int:
    raw = request.match_info["watermark"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > INT64_MAX:
        problem = f"must be a seq (0 to {INT64_MAX}, ASCII digits), got {raw[:40]!r}"
        raise ApiError(
            400,
            "InvalidRequest",
            f"snapshot watermark {problem}",
            [FieldError(loc="watermark", msg=problem)],
        )
    return int(raw)


async def _snapshot(request: web.Request, *, latest: bool) -> Snapshot:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    if not latest:
        return await gw.store.get_snapshot(session, _watermark(request))
    snapshot = await gw.store.latest_snapshot(session)
    if snapshot is None:
        raise SnapshotNotFound(session)
    return snapshot


def _envelope(snapshot: Snapshot) -> web.Response:
    """``{"info": ..., "document": ...}``, the stored document spliced in as it is."""
    info = orjson.dumps(_info(snapshot.info).model_dump())
    body = b'{"info":' + info + b',"document":' + snapshot.document_json + b"}"
    return web.Response(body=body, content_type="application/json")


def _bare(snapshot: Snapshot) -> web.Response:
    headers = {
        SNAPSHOT_WATERMARK_HEADER: str(snapshot.info.watermark),
        SNAPSHOT_SCHEMA_VERSION_HEADER: str(snapshot.info.schema_version),
    }
    return web.Response(
        body=snapshot.document_json, content_type="application/json", headers=headers
    )


@routes.put("/v1/sessions/{session}/snapshots/{watermark}", name="put_snapshot")
async def put_snapshot(request: web.Request) -> web.Response:
    """An owner write: only the owner at ``epoch`` (the instance named at it, for a
    session with owner credentials) stores a snapshot, checked in the store's write
    transaction; and the document must be the state at the URL's watermark — what the
    next owner restores is what the journal says, never a relabelled older state."""
    gw = gateway(request)
    session = session_of(request)
    owner = await gw.auth.owner(request, session)
    watermark = _watermark(request)
    schema_version = required_int_query(request, "schema_version", minimum=1, maximum=INT32_MAX)
    epoch = required_int_query(request, "epoch", minimum=1)
    await check_owner(gw, session, epoch, owner)  # before reading what may be 256 MiB
    spool = SnapshotSpool()
    try:
        document, says = await _spooled(request, spool, gw.config.max_snapshot_bytes)
        if says != watermark:
            problem = (
                f"the document is the state at watermark {says}, not {watermark}"
                if says is not None
                else "the document's watermark is not one integer"
            )
            raise ApiError(
                400,
                "InvalidSnapshot",
                f"{problem}: store a snapshot at the watermark its document was folded to",
                [FieldError(loc="watermark", msg=problem)],
            )
        # Stored (and visible) only now, every check of the document passed; the
        # store checks the writer's epoch again in its write transaction.
        info = await gw.store.put_snapshot(
            session,
            watermark=watermark,
            schema_version=schema_version,
            document_json=document,
            owner_epoch=epoch,
            owner=owner,
        )
    finally:
        await asyncio.to_thread(spool.close)
    await retention.enforce(gw.store, session)
    return json_response(_info(info), status=201)


async def _spooled(
    request: web.Request, spool: SnapshotSpool, limit: int
) -> tuple[CompressedDocument, int | None]:
    """The body through ``spool`` (checked and compressed on a thread as it arrives):
    what it costs in memory is a few pieces, whatever the document's size."""
    pieces: list[bytes] = []
    held = 0
    try:
        async for piece in read_body_pieces(request, limit=limit):
            pieces.append(piece)
            held += len(piece)
            if held >= SPOOL_PIECE_BYTES:
                await asyncio.to_thread(_feed, spool, pieces)
                pieces, held = [], 0
        await asyncio.to_thread(_feed, spool, pieces)
        return await asyncio.to_thread(spool.finish)
    except DocumentRefused as exc:
        raise ApiError(400, exc.reason, str(exc)) from None


def _feed(spool: SnapshotSpool, pieces: list[bytes]) -> None:
    for piece in pieces:
        spool.feed(piece)


@routes.get("/v1/sessions/{session}/snapshots", name="list_snapshots")
async def list_snapshots(request: web.Request) -> web.Response:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    infos = await gw.store.list_snapshots(session)
    return json_response([_info(i).model_dump() for i in infos])


@routes.get("/v1/sessions/{session}/snapshots/latest", name="latest_snapshot")
async def latest_snapshot(request: web.Request) -> web.Response:
    return _envelope(await _snapshot(request, latest=True))


@routes.get("/v1/sessions/{session}/snapshots/latest/document", name="latest_snapshot_document")
async def latest_snapshot_document(request: web.Request) -> web.Response:
    return _bare(await _snapshot(request, latest=True))


@routes.get("/v1/sessions/{session}/snapshots/{watermark}", name="get_snapshot")
async def get_snapshot(request: web.Request) -> web.Response:
    return _envelope(await _snapshot(request, latest=False))


@routes.get("/v1/sessions/{session}/snapshots/{watermark}/document", name="get_snapshot_document")
async def get_snapshot_document(request: web.Request) -> web.Response:
    return _bare(await _snapshot(request, latest=False))
