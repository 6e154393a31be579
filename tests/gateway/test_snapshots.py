"""Snapshots over HTTP: owners store them, shadows and the engine read them."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from shadowpod.agent.app import Agent
from shadowpod.agent.restore import restore
from shadowpod.api.models import OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.errors import StateDocumentInvalid
from tests.gateway.conftest import CONTROL, RunningGateway, Session, call

DOCUMENT = {"schema_version": 3, "watermark": 2, "memory": {"lang": {"value": "fr"}}}


async def test_no_snapshot_yet_is_404(
    http: aiohttp.ClientSession, url: str, agent: GatewayClient, owned: Session
) -> None:
    base = f"{url}/v1/sessions/{owned.name}/snapshots"
    latest = await call(http, "GET", f"{base}/latest", token=owned.agent_token)
    bare = await call(http, "GET", f"{base}/latest/document", token=owned.agent_token)
    listed = await call(http, "GET", base, token=owned.agent_token)
    assert (latest.status, latest.reason) == (404, "SnapshotNotFound")
    assert (bare.status, bare.reason) == (404, "SnapshotNotFound")
    assert (listed.status, listed.json) == (200, [])
    assert await agent.latest_snapshot(owned.name) is None
    assert await agent.snapshot_document(owned.name) is None


async def test_a_stored_snapshot_reads_back_latest_by_watermark_and_listed(
    http: aiohttp.ClientSession,
    url: str,
    agent: GatewayClient,
    client: GatewayClient,
    owned: Session,
) -> None:
    for n in range(3):
        await client.post_message(owned.name, f"m{n}")
    base = f"{url}/v1/sessions/{owned.name}/snapshots"

    put = await call(
        http,
        "PUT",
        f"{base}/2",
        token=owned.agent_token,
        params={"schema_version": 3, "epoch": 1},
        json=DOCUMENT,
    )
    await agent.put_snapshot(
        owned.name, epoch=1, watermark=3, schema_version=3, document={**DOCUMENT, "watermark": 3}
    )

    assert put.status == 201
    assert set(put.json) == {"watermark", "schema_version", "size_bytes", "created"}
    assert (put.json["watermark"], put.json["schema_version"]) == (2, 3)
    assert put.json["size_bytes"] > 0
    latest = await agent.latest_snapshot(owned.name)
    by_watermark = await agent.snapshot(owned.name, 2)
    listed = await agent.snapshots(owned.name)
    assert latest is not None and latest.info.watermark == 3
    assert latest.document["watermark"] == 3
    assert by_watermark.document == DOCUMENT
    assert [s.watermark for s in listed] == [2, 3]
    assert (await client.status(owned.name)).latest_snapshot == 3


async def test_the_bare_document_is_the_text_the_owner_stored(
    agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    await client.post_message(owned.name, "m")
    # Key order and spacing as the owner wrote them: the gateway never re-encodes.
    text = b'{"watermark": 1,  "schema_version": 3, "memory": {"b": 1, "a": [1, 2]}}'
    await agent.put_snapshot(owned.name, epoch=1, watermark=1, schema_version=3, document_json=text)

    latest = await agent.snapshot_document(owned.name)
    at_one = await agent.snapshot_document(owned.name, 1)

    assert latest == at_one
    assert latest is not None
    assert (latest.watermark, latest.schema_version, latest.document_json) == (1, 3, text)
    enveloped = await agent.snapshot(owned.name, 1)
    assert enveloped.document == orjson.loads(text)


async def test_a_snapshot_watermark_beyond_the_head_is_409(
    http: aiohttp.ClientSession, url: str, client: GatewayClient, owned: Session
) -> None:
    await client.post_message(owned.name, "only one")
    reply = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{owned.name}/snapshots/5",
        token=owned.agent_token,
        params={"schema_version": 3, "epoch": 1},
        json={**DOCUMENT, "watermark": 5},
    )
    # Well-formed, refused by the journal's state (it succeeds once the head is there).
    assert (reply.status, reply.reason) == (409, "SnapshotBeyondHead")
    assert "head 2" in reply.json["message"]


V3 = {"schema_version": 3, "epoch": 1}


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
    owned: Session,
    path: str,
    params: dict[str, int],
    body: bytes,
    reason: str,
    says: str,
) -> None:
    reply = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{owned.name}/snapshots/{path}",
        token=owned.agent_token,
        params=params,
        data=body,
    )
    assert (reply.status, reply.reason) == (400, reason)
    assert says in reply.json["message"]
    assert await agent.snapshots(owned.name) == []  # nothing stored


async def test_unknown_and_invalid_watermarks(
    http: aiohttp.ClientSession, url: str, agent: GatewayClient, owned: Session
) -> None:
    await agent.put_snapshot(owned.name, epoch=1, watermark=0, schema_version=3, document={})
    base = f"{url}/v1/sessions/{owned.name}/snapshots"

    unknown = await call(http, "GET", f"{base}/7", token=owned.agent_token)
    unknown_bare = await call(http, "GET", f"{base}/7/document", token=owned.agent_token)
    invalid = await call(http, "GET", f"{base}/seven", token=owned.agent_token)

    assert (unknown.status, unknown.reason) == (404, "SnapshotNotFound")
    assert (unknown_bare.status, unknown_bare.reason) == (404, "SnapshotNotFound")
    assert "seq 7" in unknown.json["message"]
    assert (invalid.status, invalid.reason) == (400, "InvalidRequest")


async def test_snapshots_need_the_session_agent_token(
    http: aiohttp.ClientSession, url: str, owned: Session
) -> None:
    put = f"{url}/v1/sessions/{owned.name}/snapshots/0"
    params = {"schema_version": 3, "epoch": 1}
    anonymous = await call(http, "PUT", put, params=params, json={})
    as_control = await call(http, "PUT", put, params=params, json={}, token=CONTROL)
    bare = await call(http, "GET", f"{put}/document")
    assert (anonymous.status, anonymous.reason) == (401, "Unauthorized")
    assert (bare.status, bare.reason) == (401, "Unauthorized")
    assert as_control.status == 201


async def test_a_fenced_out_owner_cannot_store_the_snapshot_the_next_owner_restores(
    http: aiohttp.ClientSession,
    url: str,
    control: GatewayClient,
    client: GatewayClient,
    owned: Session,
) -> None:
    await client.post_message(owned.name, "remember: my name is Ada")
    await control.set_ownership(owned.name, OwnershipChange(expect_epoch=1, epoch=2, owner="pod-b"))
    head = (await client.status(owned.name)).head
    stale = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{owned.name}/snapshots/{head}",
        token=owned.agent_token,
        params={"schema_version": 1, "epoch": 1},
        json={"watermark": head, "schema_version": 1},
    )
    assert (stale.status, stale.reason) == (409, "Fenced")
    assert stale.json["message"]
    listed = await call(
        http, "GET", f"{url}/v1/sessions/{owned.name}/snapshots", token=owned.agent_token
    )
    assert listed.json == []


async def test_an_older_state_relabelled_with_a_later_watermark_is_refused(
    http: aiohttp.ClientSession, url: str, client: GatewayClient, owned: Session
) -> None:
    for n in range(3):
        await client.post_message(owned.name, f"m{n}")
    relabelled = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{owned.name}/snapshots/4",
        token=owned.agent_token,
        params={"schema_version": 3, "epoch": 1},
        json=DOCUMENT,  # the state at watermark 2
    )
    assert (relabelled.status, relabelled.reason) == (400, "InvalidSnapshot")
    assert "state at watermark 2, not 4" in relabelled.json["message"]
    assert relabelled.locs == ["watermark"]


async def test_a_restore_refuses_a_document_that_disagrees_with_its_watermark(
    gateway: RunningGateway, agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    for n in range(3):
        await client.post_message(owned.name, f"m{n}")
    # As a gateway before this check could store it: the state at 2, labelled 4.
    await gateway.gw.store.put_snapshot(
        owned.name,
        watermark=4,
        schema_version=1,
        document_json=b'{"watermark": 2, "schema_version": 1}',
    )
    with pytest.raises(StateDocumentInvalid, match="stored at watermark 4 is the state at"):
        await restore(agent, owned.name, Agent("a", version="1"), None)
