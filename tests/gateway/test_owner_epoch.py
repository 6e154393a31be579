"""Every owner route holds the writer to the epoch it was given: owner credentials
per instance (a fenced-out owner cannot write at its successor's epoch with the
session's agent token), drain reports of one's own epoch only, and a deleted
session's channels closed."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.sessions.tokens import (
    INSTANCE_HEADER,
    OWNER_CREDENTIAL_HEADER,
    new_owner_key,
    owner_credential,
    token_hash,
)
from tests.gateway.conftest import Session, call, reply


def drained(instance: str, epoch: int) -> dict[str, object]:
    return {
        "instance": instance,
        "epoch": epoch,
        "processes": [{"name": "worker", "outcome": "killed"}],
    }


async def test_a_fenced_out_owner_cannot_report_its_successors_processes_drained(
    http: aiohttp.ClientSession, url: str, control: GatewayClient, owned: Session
) -> None:
    await control.set_ownership(owned.name, OwnershipChange(expect_epoch=1, epoch=2, owner="pod-b"))
    path = f"{url}/v1/sessions/{owned.name}/drained"
    # (Naming pod-b at 2 is refused to pod-a only with owner credentials: see below.)
    for forged in (drained("pod-a", 2), drained("pod-a", 3), drained("pod-b", 3)):
        refused = await call(http, "POST", path, token=owned.agent_token, json=forged)
        assert (refused.status, refused.reason) == (409, "Fenced"), forged
        assert refused.locs == ["epoch"]
    own = await call(http, "POST", path, token=owned.agent_token, json=drained("pod-a", 1))
    assert own.status == 200
    journal = await call(
        http, "GET", f"{url}/v1/sessions/{owned.name}/journal", token=owned.agent_token
    )
    drains = [e["id"] for e in journal.json["entries"] if e["id"].startswith("drained:")]
    assert drains == ["drained:pod-a:1:worker", "drained:pod-a:1"]


async def test_deleting_a_session_closes_its_owner_channels(
    http: aiohttp.ClientSession, url: str, control: GatewayClient, owned: Session
) -> None:
    async with http.ws_connect(
        f"{url}/v1/sessions/{owned.name}/owner/channel",
        params={"epoch": 1, "after": 0},
        headers={"Authorization": f"Bearer {owned.agent_token}"},
    ) as ws:
        assert orjson.loads((await ws.receive()).data)["op"] == "entries"
        await control.delete_session(owned.name)
        # Re-created under the same name, with the same agent token and an owner at 1.
        await control.create_session(
            CreateSession(session=owned.name, agent_token_sha256=token_hash(owned.agent_token))
        )
        await control.set_ownership(
            owned.name, OwnershipChange(expect_epoch=0, epoch=1, owner="pod-new")
        )
        async with asyncio.timeout(5):
            while True:
                message = await ws.receive()
                if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    assert (
                        orjson.loads(message.data)["op"] != "entries"
                        or not orjson.loads(message.data)["entries"]
                    ), "the old channel was fed the new session"
                    continue
                break
        assert ws.closed
    status = await call(http, "GET", f"{url}/v1/sessions/{owned.name}", token=owned.agent_token)
    assert status.json["head"] == 1  # only the new owner's epoch marker


async def test_owner_credentials_hold_each_instance_to_the_epochs_it_was_named_at(
    http: aiohttp.ClientSession, url: str, control: GatewayClient
) -> None:
    created = await control.create_session(CreateSession(session="s", owner_credentials=True))
    assert created.agent_token is not None
    token = created.agent_token
    minted = {i: await control.mint_owner_credential("s", i) for i in ("pod-a", "pod-b")}
    assert all(minted.values()) and minted["pod-a"] != minted["pod-b"]

    def as_instance(instance: str, credential: str | None = None) -> dict[str, str]:
        return {
            INSTANCE_HEADER: instance,
            OWNER_CREDENTIAL_HEADER: credential or minted[instance] or "",
        }

    await control.set_ownership("s", OwnershipChange(expect_epoch=0, epoch=1, owner="pod-a"))
    inbound = await call(http, "POST", f"{url}/v1/sessions/s/messages", json={"content": "hi"})
    journal = f"{url}/v1/sessions/s/journal"

    def body(epoch: int, content: str) -> dict[str, object]:
        entry = reply(inbound.json["seq"], content)
        return {"epoch": epoch, "entries": [{"kind": entry.kind, "payload": entry.payload}]}

    bare = await call(http, "POST", journal, token=token, json=body(1, "no credential"))
    assert (bare.status, bare.reason) == (401, "Unauthorized")
    assert OWNER_CREDENTIAL_HEADER in bare.json["message"]
    borrowed = await call(
        http,
        "POST",
        journal,
        token=token,
        json=body(1, "x"),
        headers=as_instance("pod-a", minted["pod-b"]),
    )
    assert borrowed.status == 401
    first = await call(
        http, "POST", journal, token=token, json=body(1, "hello"), headers=as_instance("pod-a")
    )
    assert first.status == 200

    await control.set_ownership("s", OwnershipChange(expect_epoch=1, epoch=2, owner="pod-b"))
    stale = await call(
        http, "POST", journal, token=token, json=body(1, "late"), headers=as_instance("pod-a")
    )
    assert (stale.status, stale.reason) == (409, "Fenced")
    # Told the epoch moved on, the old owner retries at it: still refused.
    retried = await call(
        http, "POST", journal, token=token, json=body(2, "late"), headers=as_instance("pod-a")
    )
    assert (retried.status, retried.reason) == (409, "Fenced")
    assert "pod-b" in retried.json["message"]
    snapshot = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/s/snapshots/1",
        token=token,
        params={"schema_version": 1, "epoch": 2},
        json={"watermark": 1, "schema_version": 1},
        headers=as_instance("pod-a"),
    )
    assert (snapshot.status, snapshot.reason) == (409, "Fenced")
    successor = await call(
        http,
        "POST",
        journal,
        token=token,
        json=body(2, "hello again"),
        headers=as_instance("pod-b"),
    )
    assert successor.status == 200
    reported = await call(
        http,
        "POST",
        f"{url}/v1/sessions/s/drained",
        token=token,
        json=drained("pod-b", 1),
        headers=as_instance("pod-a"),
    )
    assert (reported.status, reported.reason) == (409, "Fenced")
    assert reported.locs == ["instance"]


async def test_a_caller_that_keeps_the_owner_key_derives_the_credentials_itself(
    http: aiohttp.ClientSession, url: str, control: GatewayClient
) -> None:
    key = new_owner_key()
    created = await control.create_session(CreateSession(session="k", owner_key=key))
    assert created.agent_token is not None
    await control.set_ownership("k", OwnershipChange(expect_epoch=0, epoch=1, owner="pod-a"))
    assert await control.mint_owner_credential("k", "pod-a") == owner_credential(key, "k", "pod-a")
    ack_at = f"{url}/v1/sessions/k/acks"
    inbound = await call(http, "POST", f"{url}/v1/sessions/k/messages", json={"content": "hi"})
    headers = {
        INSTANCE_HEADER: "pod-a",
        OWNER_CREDENTIAL_HEADER: owner_credential(key, "k", "pod-a"),
    }
    acked = await call(
        http,
        "POST",
        ack_at,
        token=created.agent_token,
        headers=headers,
        json={"epoch": 1, "turn": inbound.json["seq"]},
    )
    assert acked.status == 200, acked.text
