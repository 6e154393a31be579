"""The ExchangeFence over HTTP (``POST /v1/sessions/{s}/fence``)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from shadowpod.api.models import FenceRequest, OwnershipChange
from shadowpod.client.gateway import GatewayClient, GatewayError
from tests.gateway.conftest import CONTROL, Session, ack, call, reply


async def test_a_fence_with_an_idle_owner_bumps_the_epoch_and_returns_fence_seq(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    hi = await client.post_message(owned.name, "hi")
    await agent.owner_entries(owned.name, epoch=1, after=0)
    await agent.append(owned.name, epoch=1, entries=[reply(hi.seq, "hello"), ack(hi.seq)])

    result = await control.fence(
        owned.name, FenceRequest(expect_epoch=1, new_owner="pod-b", timeout_s=2)
    )

    assert result.epoch == 2
    assert (result.delivered_through, result.acked) == (hi.seq, hi.seq)
    assert 0 <= result.waited_ms < 1000
    ownership = await control.ownership(owned.name)
    assert (ownership.epoch, ownership.owner, ownership.fence) == (2, "pod-b", "open")
    assert ownership.fence_seq == result.fence_seq
    events = (await client.events(owned.name, after=hi.seq + 2)).events
    assert [(e["payload"]["event"], e["seq"]) for e in events] == [
        ("fence", result.fence_seq - 1),
        ("epoch", result.fence_seq),
    ]
    assert events[1]["payload"]["owner"] == "pod-b"
    # From fence_seq on, the old owner can write nothing.
    with pytest.raises(GatewayError) as refused:
        await agent.append(owned.name, epoch=1, entries=[reply(hi.seq, "late")])
    assert (refused.value.status, refused.value.reason) == (409, "Fenced")
    assert (await client.status(owned.name)).head == result.fence_seq


async def test_inbound_arriving_during_a_fence_is_held_for_the_new_owner(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    first = await client.post_message(owned.name, "first")
    _, released = await agent.owner_entries(owned.name, epoch=1, after=0)
    assert released == first.seq

    fencing = asyncio.create_task(
        control.fence(owned.name, FenceRequest(expect_epoch=1, new_owner="pod-b", timeout_s=5))
    )
    await asyncio.sleep(0.1)  # the fence waits for the owner's turn to end
    assert not fencing.done()
    posted_at = time.monotonic()
    held = await client.post_message(owned.name, "during the fence")
    entries, released = await agent.owner_entries(owned.name, epoch=1, after=first.seq)
    assert held.seq in [e.seq for e in entries]  # journaled and visible ...
    assert released == first.seq  # ... but not released to the old owner
    await agent.append(owned.name, epoch=1, entries=[reply(first.seq, "one"), ack(first.seq)])
    result = await asyncio.wait_for(fencing, 5)

    assert result.epoch == 2 and result.acked == first.seq
    _, released = await agent.owner_entries(owned.name, epoch=2, after=result.fence_seq)
    assert released == held.seq  # the new owner gets the held message
    assert (await client.status(owned.name)).fence_pause_pending

    await asyncio.sleep(0.2)  # the new owner takes a while to start the held turn
    await agent.append(owned.name, epoch=2, entries=[reply(held.seq, "two")])
    served_after_s = time.monotonic() - posted_at

    # The fence pause is the held message's wait: from its arrival to its turn.
    status = await client.status(owned.name)
    assert not status.fence_pause_pending
    assert status.last_fence_pause_ms is not None
    assert 200 <= status.last_fence_pause_ms <= served_after_s * 1000 + 50


async def test_the_fence_pause_of_a_message_queued_behind_a_busy_owner_starts_with_the_fence(
    agent: GatewayClient, client: GatewayClient, control: GatewayClient, owned: Session
) -> None:
    window = 4  # the gateway's default delivery window
    posted = [await client.post_message(owned.name, f"m{n}") for n in range(window + 1)]
    _, released = await agent.owner_entries(owned.name, epoch=1, after=0)
    assert released == posted[window - 1].seq  # the last one waits behind the window
    await asyncio.sleep(1.0)  # the owner's backlog: not the fence's doing

    fence_started = time.monotonic()
    fencing = asyncio.create_task(
        control.fence(owned.name, FenceRequest(expect_epoch=1, new_owner="pod-b", timeout_s=5))
    )
    # The owner's turns end well after the fence began (and after the fence stopped
    # waiting for a gap between them to close the gate in).
    await asyncio.sleep(0.4)
    done = [e for p in posted[:window] for e in (reply(p.seq, "ok"), ack(p.seq))]
    await agent.append(owned.name, epoch=1, entries=done)
    await asyncio.wait_for(fencing, 5)
    await agent.append(owned.name, epoch=2, entries=[reply(posted[window].seq, "late")])
    fence_to_served_ms = (time.monotonic() - fence_started) * 1000

    status = await client.status(owned.name)
    assert status.last_fence_pause_ms is not None
    # Counted from the fence (about 350 ms here), not from the arrival (over 1 s ago).
    assert 250 <= status.last_fence_pause_ms <= fence_to_served_ms + 50 < 950


async def test_a_fence_the_owner_does_not_answer_times_out_and_delivery_resumes(
    http: aiohttp.ClientSession,
    url: str,
    agent: GatewayClient,
    client: GatewayClient,
    control: GatewayClient,
    owned: Session,
) -> None:
    busy = await client.post_message(owned.name, "a long turn")
    _, released = await agent.owner_entries(owned.name, epoch=1, after=0)
    assert released == busy.seq  # released, never acked

    answer = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/fence",
        token=CONTROL,
        json={"expect_epoch": 1, "new_owner": "pod-b", "timeout_s": 0.3},
    )

    assert answer.status == 409, answer.text
    assert answer.reason == "FenceTimeout"
    assert "the fence was lifted" in answer.json["message"]
    ownership = await control.ownership(owned.name)
    assert (ownership.epoch, ownership.owner, ownership.fence) == (1, "pod-a", "open")
    markers = [
        e["payload"]["event"]
        for e in (await client.events(owned.name, after=busy.seq, kinds=["control"])).events
    ]
    assert markers == ["fence", "unfence"]
    # Delivery to the same owner resumes, and it still writes at its epoch.
    after = await client.post_message(owned.name, "after the fence")
    _, released = await agent.owner_entries(
        owned.name, epoch=1, after=after.seq - 1, released=busy.seq, wait_s=2
    )
    assert released == after.seq
    appended, _, _ = await agent.append(owned.name, epoch=1, entries=[ack(busy.seq)])
    assert appended[0].seq == after.seq + 1
    metrics = (await call(http, "GET", f"{url}/metrics")).text
    assert 'shadowpod_fences_total{result="timeout"} 1.0' in metrics


async def test_a_fence_of_another_epoch_is_409_epoch_conflict_and_changes_nothing(
    http: aiohttp.ClientSession, url: str, control: GatewayClient, owned: Session
) -> None:
    answer = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/fence",
        token=CONTROL,
        json={"expect_epoch": 4, "new_owner": "pod-b"},
    )
    assert (answer.status, answer.reason) == (409, "EpochConflict")
    ownership = await control.ownership(owned.name)
    assert (ownership.epoch, ownership.fence) == (1, "open")
    invalid = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/fence",
        token=CONTROL,
        json={"expect_epoch": 1, "new_owner": "", "timeout_s": 0},
    )
    assert invalid.status == 400
    assert sorted(invalid.locs) == ["new_owner", "timeout_s"]


async def test_a_fence_at_the_last_epoch_is_a_400_saying_so_not_a_500(
    http: aiohttp.ClientSession, url: str, control: GatewayClient, session: Session
) -> None:
    last = 2**63 - 1
    await control.set_ownership(
        session.name, OwnershipChange(expect_epoch=0, epoch=last, owner="pod-a")
    )
    fenced = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{session.name}/fence",
        token=CONTROL,
        json={"expect_epoch": last, "new_owner": "pod-b", "timeout_s": 1},
    )
    assert (fenced.status, fenced.reason) == (400, "InvalidRequest"), fenced.text
    assert fenced.locs == ["expect_epoch"]
    ownership = await call(
        http, "GET", f"{url}/v1/sessions/{session.name}/ownership", token=CONTROL
    )
    assert ownership.json["epoch"] == last
