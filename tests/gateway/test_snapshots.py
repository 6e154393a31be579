"""Snapshots over HTTP: owners store them, shadows and the engine read them."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import CONTROL, Session, call

DOCUMENT = {"schema_version": 3, "watermark": 2, "memory": {"lang": {"value": "fr"}}}


async def test_no_snapshot_yet_is_404(
    http: aiohttp.ClientSession, url: str, agent: GatewayClient, session: Session
) -> None:
    base = f"{url}/v1/sessions/{session.name}/snapshots"
    latest = await call(http, "GET", f"{base}/latest", token=session.agent_token)
    bare = await call(http, "GET", f"{base}/latest/document", token=session.agent_token)
    listed = await call(http, "GET", base, token=session.agent_token)
    assert (latest.status, latest.reason) == (404, "SnapshotNotFound")
    assert (bare.status, bare.reason) == (404, "SnapshotNotFound")
    assert (listed.status, listed.json) == (200, [])
    assert await agent.latest_snapshot(session.name) is None
    assert await agent.snapshot_document(session.name) is None


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
        f"{base}/2",
        token=session.agent_token,
        params={"schema_version": 3},
        json=DOCUMENT,
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


async def test_the_bare_document_is_the_text_the_owner_stored(
    agent: GatewayClient, client: GatewayClient, session: Session
) -> None:
    await client.post_message(session.name, "m")
    # Key order and spacing as the owner wrote them: the gateway never re-encodes.
    text = b'{"watermark": 1,  "schema_version": 3, "memory": {"b": 1, "a": [1, 2]}}'
    await agent.put_snapshot(session.name, watermark=1, schema_version=3, document_json=text)

    latest = await agent.snapshot_document(session.name)
    at_one = await agent.snapshot_document(session.name, 1)

    assert latest == at_one
    assert latest is not None
    assert (latest.watermark, latest.schema_version, latest.document_json) == (1, 3, text)
    enveloped = await agent.snapshot(session.name, 1)
    assert enveloped.document == orjson.loads(text)


async def test_a_snapshot_watermark_beyond_the_head_is_400(
    http: aiohttp.ClientSession, url: str, client: GatewayClient, session: Session
) -> None:
    await client.post_message(session.name, "only one")
    reply = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{session.name}/snapshots/5",
        token=session.agent_token,
        params={"schema_version": 3},
        json=DOCUMENT,
    )
    assert (reply.status, reply.reason) == (400, "InvalidSnapshot")
    assert "head is 1" in reply.json["message"]


V3 = {"schema_version": 3}


@pytest.mark.parametrize(
    ("path", "params", "body", "reason", "says"),
    [
        pytest.param("0", {}, b"{}", "InvalidQuery", "'schema_version' is required", id="no-v"),
        pytest.param("0", {"schema_version": 0}, b"{}", "InvalidQuery", "at least 1", id="v0"),
        pytest.param("-1", V3, b"{}", "InvalidRequest", "must be a seq", id="negative"),
        pytest.param("0", V3, b'{"a": ', "MalformedJSON", "not valid JSON", id="cut-short"),
        pytest.param("0", V3, b"\xff{}", "MalformedJSON", "UTF-8", id="not-utf8"),
        pytest.param("0", V3, b"[1, 2]", "InvalidRequest", "got array", id="a-list"),
    ],
)
async def test_a_bad_snapshot_is_refused_with_what_is_wrong(
    http: aiohttp.ClientSession,
    url: str,
    agent: GatewayClient,
    session: Session,
    path: str,
    params: dict[str, int],
    body: bytes,
    reason: str,
    says: str,
) -> None:
    reply = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{session.name}/snapshots/{path}",
        token=session.agent_token,
        params=params,
        data=body,
    )
    assert (reply.status, reply.reason) == (400, reason)
    assert says in reply.json["message"]
    assert await agent.snapshots(session.name) == []  # nothing stored


async def test_unknown_and_invalid_watermarks(
    http: aiohttp.ClientSession, url: str, agent: GatewayClient, session: Session
) -> None:
    await agent.put_snapshot(session.name, watermark=0, schema_version=3, document={})
    base = f"{url}/v1/sessions/{session.name}/snapshots"

    unknown = await call(http, "GET", f"{base}/7", token=session.agent_token)
    unknown_bare = await call(http, "GET", f"{base}/7/document", token=session.agent_token)
    invalid = await call(http, "GET", f"{base}/seven", token=session.agent_token)

    assert (unknown.status, unknown.reason) == (404, "SnapshotNotFound")
    assert (unknown_bare.status, unknown_bare.reason) == (404, "SnapshotNotFound")
    assert "seq 7" in unknown.json["message"]
    assert (invalid.status, invalid.reason) == (400, "InvalidRequest")


async def test_snapshots_need_the_session_agent_token(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    put = f"{url}/v1/sessions/{session.name}/snapshots/0"
    params = {"schema_version": 3}
    anonymous = await call(http, "PUT", put, params=params, json={})
    as_control = await call(http, "PUT", put, params=params, json={}, token=CONTROL)
    bare = await call(http, "GET", f"{put}/document")
    assert (anonymous.status, anonymous.reason) == (401, "Unauthorized")
    assert (bare.status, bare.reason) == (401, "Unauthorized")
    assert as_control.status == 201
