"""Snapshots: owners store them; shadows, the operator and the engine read them.

A state document is stored and served as the JSON text the owner sent, never parsed
into objects here: a long session's state runs to megabytes, and building (then
re-encoding) its objects held the gateway's GIL for tens of milliseconds per snapshot
— every session on the gateway waited, and sessions snapshotting together stalled it
for hundreds. The document is checked to be a JSON object by a parser that releases
the GIL, compressed off the event loop, and answered by splicing bytes.
"""

from __future__ import annotations

import asyncio

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
from shadowpod.gateway.errors import ApiError, read_raw_body
from shadowpod.gateway.routes.owner import check_owner
from shadowpod.journal import codec
from shadowpod.journal.errors import SnapshotNotFound
from shadowpod.journal.store import Snapshot, SnapshotInfo

routes = web.RouteTableDef()


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
    document = await read_raw_body(request, limit=gw.config.max_snapshot_bytes)
    kind, says = await asyncio.to_thread(codec.json_shape, document)
    if kind is None:
        raise ApiError(400, "MalformedJSON", "the snapshot document is not valid JSON (UTF-8)")
    if kind != "object":
        raise ApiError(
            400,
            "InvalidRequest",
            f"the snapshot document must be a JSON object (the session state), got {kind}",
        )
    if says != watermark:
        problem = (
            f"the document is the state at watermark {says}, not {watermark}"
            if says is not None
            else "the document's watermark is not an integer"
        )
        raise ApiError(
            400,
            "InvalidSnapshot",
            f"{problem}: store a snapshot at the watermark its document was folded to",
            [FieldError(loc="watermark", msg=problem)],
        )
    info = await gw.store.put_snapshot(
        session,
        watermark=watermark,
        schema_version=schema_version,
        document_json=document,
        owner_epoch=epoch,
        owner=owner,
    )
    return json_response(_info(info), status=201)


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
