"""Clients over HTTP: posting messages (idempotently), reading events as JSON pages,
long-polls and Server-Sent Events, and the session's status."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from shadowpod.client.gateway import GatewayClient
from shadowpod.client.sse import SseEvent, iter_sse
from shadowpod.domain.entries import JournalEntry
from tests.gateway.conftest import Session, ack, call, closing, reply


async def test_a_posted_message_is_accepted_with_202_and_its_seq(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    first = await call(
        http, "POST", f"{url}/v1/sessions/{session.name}/messages", json={"content": "hello"}
    )
    second = await call(
        http, "POST", f"{url}/v1/sessions/{session.name}/messages", json={"content": "again"}
    )
    assert first.status == second.status == 202
    assert first.json["session"] == session.name
    assert (first.json["seq"], second.json["seq"]) == (1, 2)
    assert first.json["duplicate"] is False
    assert first.json["id"] != second.json["id"]  # the gateway made idempotency keys


async def test_the_same_id_twice_returns_the_original_seq_and_journals_one_entry(
    client: GatewayClient, session: Session
) -> None:
    original = await client.post_message(session.name, "first try", id="msg-42")
    await client.post_message(session.name, "something else")
    retry = await client.post_message(session.name, "first try", id="msg-42")

    assert retry.seq == original.seq == 1
    assert (original.duplicate, retry.duplicate) == (False, True)
    page = await client.events(session.name)
    assert [e["id"] for e in page.events].count("msg-42") == 1
    assert len(page.events) == 2
    [kept] = [e for e in page.events if e["id"] == "msg-42"]
    assert kept["payload"]["content"] == "first try"


async def test_events_are_read_as_json_pages_after_a_seq(
    client: GatewayClient, session: Session
) -> None:
    for n in range(5):
        await client.post_message(session.name, f"m{n}", meta={"n": n})

    first = await client.events(session.name, after=0, limit=2)
    rest = await client.events(session.name, after=first.next_after, limit=100)
    empty = await client.events(session.name, after=rest.next_after)

    assert [e["seq"] for e in first.events] == [1, 2]
    assert (first.next_after, first.head) == (2, 5)
    assert [e["payload"]["content"] for e in rest.events] == ["m2", "m3", "m4"]
    assert (rest.next_after, rest.head) == (5, 5)
    assert empty.events == [] and (empty.next_after, empty.head) == (5, 5)
    event = first.events[0]
    assert set(event) == {"seq", "id", "kind", "epoch", "ts", "payload"}
    assert (event["kind"], event["epoch"]) == ("message", 0)
    assert event["payload"] == {"role": "user", "content": "m0", "meta": {"n": 0}}
    assert event["ts"].endswith("Z")


async def test_kinds_filters_events_and_the_page_still_moves_past_the_rest(
    client: GatewayClient, control: GatewayClient, session: Session
) -> None:
    await client.post_message(session.name, "one")
    await control.request_snapshot(session.name)  # a control entry
    await client.post_message(session.name, "two")

    messages = await client.events(session.name, kinds=["message"])
    controls = await client.events(session.name, kinds=["control"])

    assert [e["seq"] for e in messages.events] == [1, 3]
    assert [(e["seq"], e["payload"]["event"]) for e in controls.events] == [(2, "snapshot_request")]
    assert messages.next_after == controls.next_after == messages.head == 3


async def test_a_long_poll_answers_as_soon_as_an_event_arrives(
    client: GatewayClient, session: Session
) -> None:
    await client.post_message(session.name, "before")

    started = time.monotonic()
    poll = asyncio.create_task(client.events(session.name, after=1, wait_s=5))
    await asyncio.sleep(0.1)
    assert not poll.done()
    await client.post_message(session.name, "during")
    page = await asyncio.wait_for(poll, 3)

    assert [e["payload"]["content"] for e in page.events] == ["during"]
    assert time.monotonic() - started < 2


async def test_a_long_poll_with_nothing_new_answers_empty_after_its_wait(
    client: GatewayClient, session: Session
) -> None:
    started = time.monotonic()
    page = await client.events(session.name, after=0, wait_s=0.2)
    assert page.events == [] and page.head == page.next_after == 0
    assert 0.15 <= time.monotonic() - started < 2


async def _batches(stream: AsyncIterator[list[JournalEntry]], entries: int) -> list[JournalEntry]:
    """Entries from ``stream`` until at least ``entries`` arrived."""
    got: list[JournalEntry] = []
    async with asyncio.timeout(5):
        async for batch in stream:
            got += batch
            if len(got) >= entries:
                return got
    raise AssertionError(f"the stream ended after {len(got)} entries")


async def test_the_event_stream_sends_the_journal_then_new_events(
    client: GatewayClient, session: Session
) -> None:
    await client.post_message(session.name, "old")
    stream = client.event_stream(session.name, after=0)
    async with closing(stream):
        [old] = await _batches(stream, 1)
        await client.post_message(session.name, "new")
        [new] = await _batches(stream, 1)

    assert (old.seq, old.payload["content"]) == (1, "old")
    assert (new.seq, new.payload["content"], new.kind) == (2, "new", "message")


async def _sse_events(response: aiohttp.ClientResponse, count: int) -> list[SseEvent]:
    events: list[SseEvent] = []
    async with asyncio.timeout(5):
        async for event in iter_sse(response.content):
            events.append(event)
            if len(events) >= count:
                break
    return events


async def test_the_event_stream_resumes_after_last_event_id(
    http: aiohttp.ClientSession, client: GatewayClient, url: str, session: Session
) -> None:
    for n in range(4):
        await client.post_message(session.name, f"m{n}")
    stream_url = f"{url}/v1/sessions/{session.name}/events/stream"

    async with http.get(stream_url, params={"after": 0}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        [first] = await _sse_events(response, 1)
    async with http.get(stream_url, headers={"Last-Event-ID": "2"}) as resumed:
        [again] = await _sse_events(resumed, 1)

    assert first.event == "entries"
    assert first.id == "4"  # the seq of the last entry in the event
    assert [e["seq"] for e in _json(first.data)] == [1, 2, 3, 4]
    # Last-Event-ID wins over ``after`` and resumes right after it.
    assert [e["payload"]["content"] for e in _json(again.data)] == ["m2", "m3"]
    assert again.id == "4"


async def test_the_event_stream_of_an_unknown_session_is_404_before_it_starts(
    http: aiohttp.ClientSession, url: str
) -> None:
    reply = await call(http, "GET", f"{url}/v1/sessions/nobody/events/stream")
    assert reply.status == 404
    assert reply.reason == "SessionNotFound"


async def test_the_session_status_tells_head_owner_and_delivery(
    client: GatewayClient, agent: GatewayClient, owned: Session
) -> None:
    # Seq 1 is the control entry that recorded epoch 1.
    hi = await client.post_message(owned.name, "hi")
    _, released = await agent.owner_entries(owned.name, epoch=1, after=0)
    assert released == hi.seq == 2

    before_ack = await client.status(owned.name)
    await agent.append(owned.name, epoch=1, entries=[reply(hi.seq, "hello"), ack(hi.seq)])
    after_ack = await client.status(owned.name)

    assert before_ack.head == 2
    assert (before_ack.ownership.epoch, before_ack.ownership.owner) == (1, "pod-a")
    assert before_ack.ownership.fence_seq == 1
    assert (before_ack.delivered_through, before_ack.outstanding, before_ack.acked) == (2, 1, 0)
    assert after_ack.head == 4
    assert (after_ack.acked, after_ack.outstanding, after_ack.acks) == (2, 0, {1: 2})
    assert after_ack.latest_snapshot is None


def _json(data: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = orjson.loads(data)
    return loaded
