"""Snapshots: owners store them; shadows, the operator and the engine read them."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from shadowpod.api.models import SnapshotInfoOut, SnapshotPut
from shadowpod.domain.entries import format_ts
from shadowpod.gateway.context import gateway, json_response, session_of
from shadowpod.gateway.errors import ApiError, read_body
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


async def _snapshot_response(snapshot: Snapshot) -> web.Response:
    """The snapshot as JSON, encoded off the event loop: documents run to megabytes."""
    answer = {"info": _info(snapshot.info).model_dump(), "document": snapshot.document}
    body = await asyncio.to_thread(orjson.dumps, answer)
    return web.Response(body=body, content_type="application/json")


@routes.put("/v1/sessions/{session}/snapshots", name="put_snapshot")
async def put_snapshot(request: web.Request) -> web.Response:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    body = await read_body(request, SnapshotPut, limit=gw.config.max_snapshot_bytes)
    info = await gw.store.put_snapshot(
        session,
        watermark=body.watermark,
        schema_version=body.schema_version,
        document=body.document,
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
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    snapshot = await gw.store.latest_snapshot(session)
    if snapshot is None:
        raise SnapshotNotFound(session)
    return await _snapshot_response(snapshot)


@routes.get("/v1/sessions/{session}/snapshots/{watermark}", name="get_snapshot")
async def get_snapshot(request: web.Request) -> web.Response:
    gw = gateway(request)
    session = session_of(request)
    await gw.auth.agent(request, session)
    raw = request.match_info["watermark"]
    if not raw.isdigit():
        raise ApiError(400, "InvalidRequest", f"snapshot watermark must be a seq, got {raw!r}")
    return await _snapshot_response(await gw.store.get_snapshot(session, int(raw)))
