"""Schedules belong to the session: the gateway journals each fire exactly once, and
keeps firing, without repeating a fire, after it restarts on the same journal."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from typing import Any

import aiohttp

from shadowpod.api.models import CreateSession, ScheduleSpec
from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import CONTROL, StartGateway, call

EVERY_S = 0.2


async def fires(url: str, session: str, at_least: int) -> list[dict[str, Any]]:
    """The fire entries journaled, once there are at least ``at_least``."""
    async with GatewayClient(url) as client, asyncio.timeout(5):
        while True:
            page = await client.events(session, kinds=["schedule"], wait_s=0.5)
            fired = [e for e in page.events if e["payload"]["op"] == "fire"]
            if len(fired) >= at_least:
                return fired
            await asyncio.sleep(0.05)


def fire_nos(entries: list[dict[str, Any]]) -> list[int]:
    return [e["payload"]["fire_no"] for e in entries]


async def test_fires_are_journaled_once_each_and_continue_after_a_restart(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    first = await start_gateway()
    async with GatewayClient(first.url, CONTROL) as control:
        await control.create_session(
            CreateSession(
                session="s",
                schedules=[ScheduleSpec(schedule_id="tick", every_s=EVERY_S, content="tock")],
            )
        )
    before = await fires(first.url, "s", 3)
    metrics = (await call(http, "GET", f"{first.url}/metrics")).text
    await first.stop()

    second = await start_gateway()
    after = await fires(second.url, "s", len(before) + 3)

    for entry in after:
        assert entry["id"] == f"schedule:tick:{entry['payload']['fire_no']}"
        assert entry["epoch"] == 0  # inbound: delivered to whoever owns the session
        assert entry["payload"]["content"] == "tock"
        assert re.fullmatch(r"schedule:tick:\d+", entry["id"])
    numbers = fire_nos(after)
    assert fire_nos(before) == list(range(1, len(before) + 1))  # each n exactly once
    assert after[: len(before)] == before  # the restart rewrote nothing
    assert len(set(numbers)) == len(numbers)
    assert numbers == sorted(numbers)
    assert numbers[-1] > fire_nos(before)[-1]  # fires continued after the restart
    fired_total = re.search(r"^shadowpod_schedule_fires_total (\S+)$", metrics, re.M)
    assert fired_total is not None and float(fired_total.group(1)) >= len(before)


async def test_fires_are_spaced_by_the_schedule_period(start_gateway: StartGateway) -> None:
    gateway = await start_gateway()
    async with GatewayClient(gateway.url, CONTROL) as control:
        await control.create_session(
            CreateSession(session="s", schedules=[ScheduleSpec(schedule_id="t", every_s=EVERY_S)])
        )
        [set_entry] = (await control.events("s", kinds=["schedule"])).events[:1]
    fired = await fires(gateway.url, "s", 3)

    # Fire n is due n periods after the schedule was set: never earlier, and on a
    # loaded machine not much later (a late fire is not followed by a burst of others:
    # the next is due at its own time, which may then be sooner than a period after;
    # fires missed altogether are coalesced into the latest one due).
    anchor = datetime.fromisoformat(set_entry["ts"])
    assert set_entry["payload"]["op"] == "set"
    numbers = fire_nos(fired)
    assert numbers[0] >= 1 and numbers == sorted(set(numbers))
    for entry in fired:
        due = EVERY_S * entry["payload"]["fire_no"]
        late = (datetime.fromisoformat(entry["ts"]) - anchor).total_seconds() - due
        assert 0 <= late <= 5 * EVERY_S, (entry["payload"]["fire_no"], late)


async def test_a_gateway_without_schedules_fires_nothing(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(schedules=False)
    async with GatewayClient(gateway.url, CONTROL) as control:
        await control.create_session(
            CreateSession(session="s", schedules=[ScheduleSpec(schedule_id="t", every_s=0.05)])
        )
        await asyncio.sleep(0.3)
        page = await control.events("s", kinds=["schedule"])
    assert [e["payload"]["op"] for e in page.events] == ["set"]
