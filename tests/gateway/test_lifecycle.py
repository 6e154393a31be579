"""Suspend, wake, resume and history over HTTP (``/v1/sessions/{s}/suspend`` …)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from shadowpod.api.models import (
    CreateSession,
    ForkFrom,
    OwnershipChange,
    ScheduleSpec,
    SuspendRequest,
)
from shadowpod.client.gateway import GatewayClient, GatewayError
from tests.conftest import PG_DSN, drop_pg_schema
from tests.gateway.conftest import CONTROL, Session, StartGateway, ack, call, reply


async def _served(agent: GatewayClient, client: GatewayClient, session: str, text: str) -> int:
    """A message posted and answered by the owner at epoch 1; its seq."""
    posted = await client.post_message(session, text)
    await agent.owner_entries(session, epoch=1, after=0)
    await agent.append(session, epoch=1, entries=[reply(posted.seq, "ok"), ack(posted.seq)])
    return posted.seq


async def _suspend(control: GatewayClient, session: str, epoch: int = 1) -> int:
    result = await control.suspend(
        session, SuspendRequest(expect_epoch=epoch, next_owner="pod-b", timeout_s=2)
    )
    return result.epoch


async def test_a_suspended_session_fences_its_owner_and_keeps_messages_until_resumed(
    agent: GatewayClient,
    client: GatewayClient,
    control: GatewayClient,
    owned: Session,
    url: str,
    http: aiohttp.ClientSession,
) -> None:
    first = await _served(agent, client, owned.name, "first")
    result = await control.suspend(
        owned.name, SuspendRequest(expect_epoch=1, next_owner="pod-b", timeout_s=2)
    )
    assert result.epoch == 2
    ownership = await control.ownership(owned.name)
    assert (ownership.epoch, ownership.owner, ownership.fence) == (2, "pod-b", "suspended")
    with pytest.raises(GatewayError) as refused:  # the old owner can write nothing
        await agent.append(owned.name, epoch=1, entries=[reply(first, "late")])
    assert (refused.value.status, refused.value.reason) == (409, "Fenced")

    # Messages keep being accepted: the first wakes the session, all wait in the journal.
    answers = [
        await call(
            http,
            "POST",
            f"{url}/v1/sessions/{owned.name}/messages",
            json={"id": f"m{i}", "content": f"while suspended {i}"},
        )
        for i in range(3)
    ]
    assert [a.status for a in answers] == [202, 202, 202]
    assert all(a.json["waking"] and a.headers["Retry-After"] == "5" for a in answers)
    waited = [a.json["seq"] for a in answers]
    assert (await control.ownership(owned.name)).fence == "waking"
    wakes = await control.wakes(after=0)
    assert [(w.session, w.epoch) for w in wakes.wakes] == [(owned.name, 2)]  # asked once

    # The next owner runs but is released nothing until the session resumes ...
    _, released = await agent.owner_entries(owned.name, epoch=2, after=0)
    assert released == first
    opened = await control.resume(owned.name, expect_epoch=2)
    assert (opened.epoch, opened.owner, opened.fence) == (2, "pod-b", "open")
    # ... then everything that waited, in order.
    entries, released = await agent.owner_entries(owned.name, epoch=2, after=0)
    assert released == waited[-1]
    assert [e.seq for e in entries if e.kind == "message" and e.epoch == 0] == [first, *waited]

    # A message now is an ordinary one.
    after = await client.post_message(owned.name, "awake")
    assert not after.waking

    history = await client.history(owned.name)
    told = [(e.event, e.epoch) for e in history.events if e.event != "session_created"]
    assert told == [
        ("epoch", 1),
        ("fence", 1),
        ("epoch", 2),
        ("suspend", 2),
        ("wake", 2),
        ("resume", 2),
    ]
    seqs = [e.seq for e in history.events]
    assert seqs == sorted(seqs) and history.next_after == history.head
    suspend = next(e for e in history.events if e.event == "suspend")
    assert suspend.reason == "Requested" and suspend.detail["fence_seq"] == result.fence_seq
    wake = next(e for e in history.events if e.event == "wake")
    assert waited[0] < wake.seq < waited[1]


async def test_a_suspend_is_no_fence_pause(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    busy = await client.post_message(owned.name, "a long turn")
    await agent.owner_entries(owned.name, epoch=1, after=0)
    suspending = asyncio.create_task(_suspend(control, owned.name))
    await asyncio.sleep(0.1)  # the suspend waits for the owner's turn to end
    held = await client.post_message(owned.name, "held by the suspend's fence")
    await agent.append(owned.name, epoch=1, entries=[reply(busy.seq, "done"), ack(busy.seq)])
    assert await asyncio.wait_for(suspending, 5) == 2
    await asyncio.sleep(0.3)  # suspended a while: that is no pause of a live move
    await control.resume(owned.name, expect_epoch=2)
    _, released = await agent.owner_entries(owned.name, epoch=2, after=0)
    assert released == held.seq
    await agent.append(owned.name, epoch=2, entries=[reply(held.seq, "hi"), ack(held.seq)])
    status = await client.status(owned.name)
    assert status.last_fence_pause_ms is None and not status.fence_pause_pending


async def test_a_waking_message_can_wait_for_the_owner(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    await _served(agent, client, owned.name, "first")
    await _suspend(control, owned.name)

    async def operator() -> None:
        wakes = await control.wakes(after=0, wait_s=5)
        assert [w.session for w in wakes.wakes] == [owned.name]
        await asyncio.sleep(0.2)  # the new owner starts
        await control.resume(owned.name, expect_epoch=2)

    resuming = asyncio.create_task(operator())
    posted = await client.post_message(owned.name, "wake up", wait_s=5)
    await resuming
    assert not posted.waking  # answered once the owner was up
    _, released = await agent.owner_entries(owned.name, epoch=2, after=0)
    assert released == posted.seq


async def test_a_waking_message_not_answered_in_its_wait_is_told_to_retry(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    await _served(agent, client, owned.name, "first")
    await _suspend(control, owned.name)
    posted = await client.post_message(owned.name, "anyone?", id="q1", wait_s=0.3)
    assert posted.waking
    again = await client.post_message(owned.name, "anyone?", id="q1")
    assert again.duplicate and again.seq == posted.seq and again.waking  # retried safely


async def test_resuming_a_session_that_is_not_suspended_is_refused(
    control: GatewayClient, owned: Session, url: str, http: aiohttp.ClientSession
) -> None:
    answer = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/resume",
        token=CONTROL,
        json={"expect_epoch": 1},
    )
    assert (answer.status, answer.reason) == (409, "NotSuspended")
    assert "not suspended" in answer.json["message"]
    assert (await control.ownership(owned.name)).fence == "open"


async def test_suspend_and_wakes_need_the_control_token(
    owned: Session, url: str, http: aiohttp.ClientSession
) -> None:
    body = {"expect_epoch": 1, "next_owner": "pod-b"}
    refused = await call(http, "POST", f"{url}/v1/sessions/{owned.name}/suspend", json=body)
    assert refused.status == 401
    assert (await call(http, "GET", f"{url}/v1/wakes")).status == 401


async def test_activity_is_the_latest_client_message_not_the_agents_output(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    fresh = await control.activity(owned.name)
    assert fresh.last_message_seq is None and fresh.delivery == "open"
    seq = await _served(agent, client, owned.name, "hello")
    seen = await control.activity(owned.name)
    assert seen.last_message_seq == seq
    assert seen.quiet_since == seen.last_message_at
    assert seen.quiet_since > fresh.quiet_since


async def test_schedules_keep_firing_while_suspended_and_wait_for_the_resume(
    control: GatewayClient, client: GatewayClient, url: str
) -> None:
    created = await control.create_session(
        CreateSession(
            session="ticking",
            schedules=[ScheduleSpec(schedule_id="tick", every_s=1.0, content="tock")],
        )
    )
    await control.set_ownership("ticking", OwnershipChange(expect_epoch=0, epoch=1, owner="a"))
    suspended = await control.suspend(
        "ticking", SuspendRequest(expect_epoch=1, next_owner="pod-b", timeout_s=2)
    )

    async def fired_since_suspend() -> list[int]:
        page = await client.events("ticking", after=suspended.suspend_seq, kinds=["schedule"])
        return [e["seq"] for e in page.events if e["payload"]["op"] == "fire"]

    async with asyncio.timeout(10):
        # Polled: the fires are the gateway's, in another task; nothing here to wait on.
        while len(await fired_since_suspend()) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
    # A fire is journaled, not a client's message: it does not wake the session.
    assert (await control.ownership("ticking")).fence == "suspended"
    assert (await control.wakes(after=0)).wakes == []
    await control.resume("ticking", expect_epoch=2)
    async with GatewayClient(url, created.agent_token) as agent:
        _, released = await agent.owner_entries("ticking", epoch=2, after=0)
    assert released >= max(await fired_since_suspend())


@pytest.fixture
def journal_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A journal on ``backend``: SQLite in the test's directory, or a PostgreSQL schema."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'journal.db'}"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{PG_DSN}?shadowpod_schema={schema}"
    drop_pg_schema(schema)


async def test_a_waking_schedules_fire_wakes_a_suspended_session_and_another_does_not(
    start_gateway: StartGateway, journal_url: str
) -> None:
    running = await start_gateway(journal_url=journal_url)
    async with GatewayClient(running.url, CONTROL, timeout_s=10) as control:
        suspended: dict[str, int] = {}
        for name, wake in (("waking", True), ("quiet", False)):
            schedule = ScheduleSpec(schedule_id="tick", every_s=1.0, content="tock", wake=wake)
            await control.create_session(CreateSession(session=name, schedules=[schedule]))
            await control.set_ownership(name, OwnershipChange(expect_epoch=0, epoch=1, owner="a"))
            result = await control.suspend(
                name, SuspendRequest(expect_epoch=1, next_owner="pod-b", timeout_s=2)
            )
            suspended[name] = result.suspend_seq

        async def fired_since_suspend(name: str) -> int:
            page = await control.events(name, after=suspended[name], kinds=["schedule"])
            return sum(e["payload"]["op"] == "fire" for e in page.events)

        async with asyncio.timeout(10):
            # Polled: the fires are the gateway's, in another task; nothing here to wait on.
            while min([await fired_since_suspend(n) for n in suspended]) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
        # The waking schedule's fires asked for one wake, as a client's message does;
        # the other's fires wait in the journal, the session asleep.
        wakes = await control.wakes(after=0)
        assert [(w.session, w.epoch) for w in wakes.wakes] == [("waking", 2)]
        assert (await control.ownership("waking")).fence == "waking"
        assert (await control.ownership("quiet")).fence == "suspended"
        history = await control.history("waking")
        [wake] = [e for e in history.events if e.event == "wake"]
        assert wake.reason == "schedule" and wake.seq > suspended["waking"]


async def test_a_forks_history_says_where_it_came_from_and_the_parents_names_it(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    first = await _served(agent, client, owned.name, "first")
    await _served(agent, client, owned.name, "second")
    await control.create_session(
        CreateSession(session="tryout", fork_from=ForkFrom(session=owned.name, seq=first))
    )
    fork = await client.history("tryout")
    forked = [(e.seq, e.detail) for e in fork.events if e.event == "forked"]
    assert forked == [(first, {"from": owned.name})]
    seqs = [e.seq for e in fork.events]
    assert seqs == sorted(seqs)
    parent = await client.history(owned.name)
    forks = [(e.seq, e.detail) for e in parent.events if e.event == "fork"]
    assert forks == [(first, {"fork": "tryout"})]
    # Read past the fork point: the parent's history no longer tells it.
    later = await client.history(owned.name, after=first)
    assert [e for e in later.events if e.event == "fork"] == []
