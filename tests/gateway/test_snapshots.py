"""Snapshots over HTTP: owners store them, shadows and the engine read them."""

from __future__ import annotations

import aiohttp

from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import CONTROL, Session, call

DOCUMENT = {"schema_version": 3, "watermark": 2, "memory": {"lang": {"value": "fr"}}}


async def test_no_snapshot_yet_is_404(
    http: aiohttp.ClientSession, url: str, agent: GatewayClient, session: Session
) -> None:
    latest = await call(
        http, "GET", f"{url}/v1/sessions/{session.name}/snapshots/latest", token=session.agent_token
    )
    listed = await call(
        http, "GET", f"{url}/v1/sessions/{session.name}/snapshots", token=session.agent_token
    )
    assert (latest.status, latest.reason) == (404, "SnapshotNotFound")
    assert (listed.status, listed.json) == (200, [])
    assert await agent.latest_snapshot(session.name) is None


async def test_a_stored_snapshot_reads_back_latest_by_watermark_and_listed(
    http: aiohttp.ClientSession,
    url: str,
    agent: GatewayClient,
    client: GatewayClient,
    session: Session,
) -> None:
    for n in range(3):
        await client.post_message(session.name, f"m{n}")
    base = f"{url}/v1/sessions/{session.name}/snapshots"

    put = await call(
        http,
        "PUT",
        base,
        token=session.agent_token,
        json={"watermark": 2, "schema_version": 3, "document": DOCUMENT},
    )
    await agent.put_snapshot(
        session.name, watermark=3, schema_version=3, document={**DOCUMENT, "watermark": 3}
    )

    assert put.status == 201
    assert set(put.json) == {"watermark", "schema_version", "size_bytes", "created"}
    assert (put.json["watermark"], put.json["schema_version"]) == (2, 3)
    assert put.json["size_bytes"] > 0
    latest = await agent.latest_snapshot(session.name)
    by_watermark = await agent.snapshot(session.name, 2)
    listed = await agent.snapshots(session.name)
    assert latest is not None and latest.info.watermark == 3
    assert latest.document["watermark"] == 3
    assert by_watermark.document == DOCUMENT
    assert [s.watermark for s in listed] == [2, 3]
    assert (await client.status(session.name)).latest_snapshot == 3


async def test_a_snapshot_watermark_beyond_the_head_is_400(
    http: aiohttp.ClientSession, url: str, client: GatewayClient, session: Session
) -> None:
    await client.post_message(session.name, "only one")
    reply = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{session.name}/snapshots",
        token=session.agent_token,
        json={"watermark": 5, "schema_version": 3, "document": DOCUMENT},
    )
    assert (reply.status, reply.reason) == (400, "InvalidSnapshot")
    assert "head is 1" in reply.json["message"]


async def test_unknown_and_invalid_watermarks(
    http: aiohttp.ClientSession, url: str, agent: GatewayClient, session: Session
) -> None:
    await agent.put_snapshot(session.name, watermark=0, schema_version=3, document={})
    base = f"{url}/v1/sessions/{session.name}/snapshots"

    unknown = await call(http, "GET", f"{base}/7", token=session.agent_token)
    invalid = await call(http, "GET", f"{base}/seven", token=session.agent_token)
    bad_body = await call(
        http,
        "PUT",
        base,
        token=session.agent_token,
        json={"watermark": -1, "schema_version": 0, "document": []},
    )

    assert (unknown.status, unknown.reason) == (404, "SnapshotNotFound")
    assert "seq 7" in unknown.json["message"]
    assert (invalid.status, invalid.reason) == (400, "InvalidRequest")
    assert (bad_body.status, sorted(bad_body.locs)) == (
        400,
        ["document", "schema_version", "watermark"],
    )


async def test_snapshots_need_the_session_agent_token(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    base = f"{url}/v1/sessions/{session.name}/snapshots"
    body = {"watermark": 0, "schema_version": 3, "document": {}}
    anonymous = await call(http, "PUT", base, json=body)
    as_control = await call(http, "PUT", base, json=body, token=CONTROL)
    assert (anonymous.status, anonymous.reason) == (401, "Unauthorized")
    assert as_control.status == 201
