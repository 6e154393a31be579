"""The owner over HTTP: appends at its epoch, gated deliveries, acks, drain reports,
the fence against late writes, the shadow's journal reads and the owner channel."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from shadowpod.api.models import CreateSession, DrainReport, OwnershipChange, ProcessReport
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import NewEntry
from tests.gateway.conftest import (
    CONTROL,
    RunningGateway,
    Session,
    StartGateway,
    ack,
    call,
    closing,
    reply,
)


async def test_an_owner_appends_at_its_epoch(
    agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    hi = await client.post_message(owned.name, "hi")
    memory = NewEntry(id="mem-1", kind="memory", payload={"key": "lang", "value": "fr", "turn": 2})

    appended, _, released = await agent.append(
        owned.name, epoch=1, entries=[memory, reply(hi.seq, "bonjour")]
    )
    again, _, _ = await agent.append(owned.name, epoch=1, entries=[memory])

    assert [(a.seq, a.duplicate) for a in appended] == [(3, False), (4, False)]
    assert appended[0].id == "mem-1"
    assert released is None  # no ``after``: no deliveries in the answer
    assert [(a.seq, a.duplicate) for a in again] == [(3, True)]
    events = (await client.events(owned.name, after=hi.seq)).events
    assert [(e["kind"], e["epoch"]) for e in events] == [("memory", 1), ("message", 1)]
    assert events[1]["payload"] == {"role": "assistant", "content": "bonjour", "turn": 2}


async def test_an_append_with_after_brings_back_what_was_journaled_since(
    agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    first = await client.post_message(owned.name, "first")
    second = await client.post_message(owned.name, "second")  # arrives mid-turn

    appended, entries, released = await agent.append(
        owned.name, epoch=1, entries=[reply(first.seq, "one"), ack(first.seq)], after=first.seq
    )

    assert [e.seq for e in entries] == [second.seq, appended[0].seq, appended[1].seq]
    assert released == second.seq


async def test_deliveries_release_inbound_only_a_window_ahead_of_acks(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(delivery_window=1)
    async with GatewayClient(gateway.url, CONTROL) as control:
        created = await control.create_session(CreateSession(session="s"))
        await control.set_ownership("s", OwnershipChange(expect_epoch=0, epoch=1, owner="a"))
        seqs = [(await control.post_message("s", f"m{n}")).seq for n in range(3)]
    async with GatewayClient(gateway.url, created.agent_token) as owner:
        entries, released = await owner.owner_entries("s", epoch=1, after=0)
        assert [e.seq for e in entries] == [1, *seqs]  # the owner sees the whole journal
        assert released == seqs[0]  # ... but may process only the first message

        await owner.append("s", epoch=1, entries=[reply(seqs[0], "r0"), ack(seqs[0])])
        _, released = await owner.owner_entries("s", epoch=1, after=entries[-1].seq)
        assert released == seqs[1]


async def test_a_restarted_gateway_releases_the_next_message_to_an_owner_that_acked_all(
    start_gateway: StartGateway,
) -> None:
    """An idle session (everything acked) across a gateway restart: the next message is
    released to its owner. (The new gate released the session's first messages again,
    which the owner, past them, never acks: it never got another one.)"""
    first = await start_gateway()
    async with GatewayClient(first.url, CONTROL, timeout_s=10) as control:
        created = await control.create_session(CreateSession(session="s"))
        await control.set_ownership("s", OwnershipChange(expect_epoch=0, epoch=1, owner="a"))
        async with GatewayClient(first.url, created.agent_token, timeout_s=10) as owner:
            for n in range(6):
                asked = await control.post_message("s", f"m{n}")
                await owner.append(
                    "s", epoch=1, entries=[reply(asked.seq, f"r{n}"), ack(asked.seq)]
                )
    await first.stop()
    again = await start_gateway()
    async with (
        GatewayClient(again.url, CONTROL, timeout_s=10) as control,
        GatewayClient(again.url, created.agent_token, timeout_s=10) as owner,
    ):
        seen = (await control.status("s")).head
        # The owner asks first (its channel reconnects): nothing new, nothing to release.
        entries, released = await owner.owner_entries("s", epoch=1, after=seen)
        assert entries == [] and released <= seen
        nxt = await control.post_message("s", "after the restart")
        entries, released = await owner.owner_entries(
            "s", epoch=1, after=seen, released=released, wait_s=5
        )
        assert [e.seq for e in entries] == [nxt.seq]
        assert released == nxt.seq


async def test_owner_entries_long_polls_until_something_is_released(
    agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    poll = asyncio.create_task(agent.owner_entries(owned.name, epoch=1, after=1, wait_s=5))
    await asyncio.sleep(0.1)
    assert not poll.done()
    posted = await client.post_message(owned.name, "wake up")

    entries, released = await asyncio.wait_for(poll, 3)
    assert [e.seq for e in entries] == [posted.seq]
    assert released == posted.seq


async def test_after_an_epoch_bump_the_old_owner_is_fenced_and_writes_nothing(
    http: aiohttp.ClientSession,
    url: str,
    agent: GatewayClient,
    control: GatewayClient,
    client: GatewayClient,
    owned: Session,
) -> None:
    hi = await client.post_message(owned.name, "hi")
    await agent.owner_entries(owned.name, epoch=1, after=0)
    bumped = await control.set_ownership(
        owned.name, OwnershipChange(expect_epoch=1, epoch=2, owner="pod-b")
    )
    head = (await client.status(owned.name)).head

    late = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/journal",
        token=owned.agent_token,
        json={"epoch": 1, "entries": [{"kind": "message", "payload": _late(hi.seq)}]},
    )
    late_ack = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/acks",
        token=owned.agent_token,
        json={"epoch": 1, "turn": hi.seq},
    )
    deliveries = await call(
        http,
        "GET",
        f"{url}/v1/sessions/{owned.name}/owner/entries",
        token=owned.agent_token,
        params={"epoch": 1, "after": 0},
    )

    for answer in (late, late_ack, deliveries):
        assert answer.status == 409, answer.text
        assert answer.reason == "Fenced"
        assert "current epoch is 2" in answer.json["message"]
    assert (await client.status(owned.name)).head == head == bumped.fence_seq
    # The new owner writes at the new epoch.
    appended, _, _ = await agent.append(owned.name, epoch=2, entries=[reply(hi.seq, "new")])
    assert appended[0].seq == head + 1


async def test_an_ack_is_journaled_and_moves_the_ack_watermark(
    http: aiohttp.ClientSession, url: str, client: GatewayClient, owned: Session
) -> None:
    hi = await client.post_message(owned.name, "hi")

    answer = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/acks",
        token=owned.agent_token,
        json={"epoch": 1, "turn": hi.seq},
    )

    assert answer.status == 200
    [appended] = answer.json["appended"]
    [entry] = (await client.events(owned.name, after=hi.seq)).events
    assert (entry["seq"], entry["kind"], entry["epoch"]) == (appended["seq"], "ack", 1)
    assert entry["payload"] == {"turn": hi.seq}
    status = await client.status(owned.name)
    assert (status.acked, status.acks) == (hi.seq, {1: hi.seq})  # epoch -> acked turn


async def test_a_drain_report_journals_process_entries_and_a_drained_marker(
    agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    report = DrainReport(
        instance="pod-a",
        epoch=1,
        processes=[
            ProcessReport(name="indexer", pid=41, outcome="terminated", exit_code=-15),
            ProcessReport(name="watcher", outcome="killed"),
        ],
    )

    await agent.drained(owned.name, report)
    await agent.drained(owned.name, report)  # a retry journals nothing more

    events = (await client.events(owned.name, after=1)).events
    assert [(e["id"], e["kind"], e["epoch"]) for e in events] == [
        ("drained:pod-a:1:indexer", "process", 0),
        ("drained:pod-a:1:watcher", "process", 0),
        ("drained:pod-a:1", "control", 0),
    ]
    assert events[0]["payload"] == {
        "name": "indexer",
        "op": "terminated",
        "pid": 41,
        "exit_code": -15,
    }
    assert events[2]["payload"]["event"] == "drained"
    assert events[2]["payload"]["owner"] == "pod-a"
    assert events[2]["payload"]["detail"] == {"processes": 2}


async def test_a_shadow_reads_the_journal_in_pages_and_as_a_stream(
    agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    for n in range(3):
        await client.post_message(owned.name, f"m{n}")

    page, head = await agent.journal(owned.name, after=1, limit=2)
    assert [e.seq for e in page] == [2, 3]
    assert head == 4  # the journal's head, whatever the page holds
    got: list[int] = []
    async with closing(agent.journal_stream(owned.name, after=3)) as stream, asyncio.timeout(5):
        async for batch in stream:
            got += [e.seq for e in batch]
            if got == [4]:
                await client.post_message(owned.name, "live")
            if len(got) == 2:
                break
    assert got == [4, 5]


async def test_a_missing_epoch_is_a_bad_query_not_a_fence(
    http: aiohttp.ClientSession, url: str, owned: Session
) -> None:
    for path in ("owner/entries", "owner/channel"):
        answer = await call(
            http, "GET", f"{url}/v1/sessions/{owned.name}/{path}", token=owned.agent_token
        )
        assert answer.status == 400, answer.text
        assert answer.reason == "InvalidQuery"
        assert "'epoch'" in answer.json["message"]


async def _frame(ws: aiohttp.ClientWebSocketResponse, op: str | None = None) -> dict[str, Any]:
    """The next frame (with ``op``: the next frame of that op, skipping others)."""
    async with asyncio.timeout(5):
        while True:
            message = await ws.receive()
            assert message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), message
            frame: dict[str, Any] = orjson.loads(message.data)
            if op is None or frame["op"] == op:
                return frame


async def test_the_owner_channel_delivers_answers_appends_and_ends_when_superseded(
    http: aiohttp.ClientSession,
    gateway: RunningGateway,
    control: GatewayClient,
    client: GatewayClient,
    owned: Session,
) -> None:
    hi = await client.post_message(owned.name, "hi")
    async with http.ws_connect(
        f"{gateway.url}/v1/sessions/{owned.name}/owner/channel",
        params={"epoch": 1, "after": 0},
        headers={"Authorization": f"Bearer {owned.agent_token}"},
    ) as ws:
        delivered = await _frame(ws)
        assert delivered["op"] == "entries"
        assert [e["seq"] for e in delivered["entries"]] == [1, hi.seq]
        assert delivered["released"] == hi.seq

        entries = [
            {"kind": "message", "payload": _late(hi.seq)},
            {"kind": "ack", "payload": {"turn": hi.seq}},
        ]
        await ws.send_bytes(orjson.dumps({"op": "append", "id": 7, "entries": entries}))
        appended = await _frame(ws, "appended")
        assert appended["id"] == 7
        assert [(seq, dup) for seq, _, dup in appended["appended"]] == [
            (hi.seq + 1, False),
            (hi.seq + 2, False),
        ]

        bad = {"op": "append", "id": 8, "entries": [entries[0], {"kind": "ack", "payload": {}}]}
        await ws.send_bytes(orjson.dumps(bad))
        error = await _frame(ws, "error")
        assert (error["id"], error["status"], error["reason"]) == (8, 400, "InvalidRequest")
        assert [e["loc"] for e in error["errors"]] == ["entries.1.payload.turn"]
        await ws.send_str("{not json")
        malformed = await _frame(ws, "error")
        assert (malformed["status"], malformed["reason"]) == (400, "MalformedJSON")

        await control.set_ownership(
            owned.name, OwnershipChange(expect_epoch=1, epoch=2, owner="pod-b")
        )
        await client.post_message(owned.name, "for the new owner")
        assert await _frame(ws, "superseded") == {"op": "superseded", "epoch": 1, "current": 2}
        closing = await asyncio.wait_for(ws.receive(), 5)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)

    journal = (await client.events(owned.name)).events
    assert [e["seq"] for e in journal if e["epoch"] == 1 and e["kind"] != "control"] == [
        hi.seq + 1,
        hi.seq + 2,
    ]  # the bad append journaled nothing
    stale = await call(
        http,
        "GET",
        f"{gateway.url}/v1/sessions/{owned.name}/owner/channel",
        token=owned.agent_token,
        params={"epoch": 1},
    )
    assert stale.status == 409 and stale.reason == "Fenced"


async def test_the_owner_channel_tells_a_superseded_owner_at_once(
    http: aiohttp.ClientSession, gateway: RunningGateway, control: GatewayClient, owned: Session
) -> None:
    async with http.ws_connect(
        f"{gateway.url}/v1/sessions/{owned.name}/owner/channel",
        params={"epoch": 1, "after": 0},
        headers={"Authorization": f"Bearer {owned.agent_token}"},
    ) as ws:
        assert (await _frame(ws))["op"] == "entries"
        await control.set_ownership(
            owned.name, OwnershipChange(expect_epoch=1, epoch=2, owner="pod-b")
        )
        async with asyncio.timeout(1):
            while True:
                message = await ws.receive()
                if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    raise AssertionError(f"closed without a superseded frame: {message}")
                if orjson.loads(message.data)["op"] == "superseded":
                    return


def _late(turn: int) -> dict[str, Any]:
    return {"role": "assistant", "content": "late", "turn": turn}


@pytest.mark.parametrize("kind", ["ack", "message"])
async def test_an_entry_of_a_known_kind_without_payload_is_400(
    http: aiohttp.ClientSession, url: str, client: GatewayClient, owned: Session, kind: str
) -> None:
    answer = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/journal",
        token=owned.agent_token,
        json={"epoch": 1, "entries": [{"kind": kind}]},
    )
    assert answer.status == 400, answer.text
    assert answer.json["errors"][0]["loc"].startswith("entries.0.payload")
    assert (await client.status(owned.name)).head == 1


async def test_large_entries_come_back_as_they_were_sent_from_a_restarted_gateway(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    # The journal stores large payloads compressed; what the API answers is unchanged,
    # whether the gateway has the entries in memory or reads them from the file.
    first = await start_gateway()
    async with GatewayClient(first.url, CONTROL, timeout_s=10) as control:
        created = await control.create_session(CreateSession(session="big"))
        await control.set_ownership("big", OwnershipChange(expect_epoch=0, epoch=1, owner="a"))
    question = "tell me everything " * 100
    state = {f"channel-{i}": f"value {i} of the agent's state, " * 3 for i in range(40)}
    async with (
        GatewayClient(first.url, timeout_s=10) as client,
        GatewayClient(first.url, created.agent_token, timeout_s=10) as agent,
    ):
        asked = await client.post_message("big", question)
        turn = [
            reply(asked.seq, "everything"),
            NewEntry(kind="state", payload={"turn": asked.seq, "values": state}),
            ack(asked.seq),
        ]
        await agent.append("big", epoch=1, entries=turn)
    pages = [
        await call(http, "GET", f"{first.url}/v1/sessions/big/journal", token=created.agent_token)
    ]
    await first.stop()
    again = await start_gateway()
    pages.append(
        await call(http, "GET", f"{again.url}/v1/sessions/big/journal", token=created.agent_token)
    )
    events = await call(http, "GET", f"{again.url}/v1/sessions/big/events")
    for page in pages:
        assert page.status == 200
        assert [e["payload"] for e in page.json["entries"][1:]] == [
            {"role": "user", "content": question},
            *(entry.payload for entry in turn),
        ]
    assert pages[0].json == pages[1].json
    assert [e["payload"] for e in events.json["events"] if e["kind"] == "message"] == [
        {"role": "user", "content": question},
        turn[0].payload,
    ]
