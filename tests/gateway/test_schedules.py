"""Schedules belong to the session: the gateway journals each fire exactly once, and
keeps firing, without repeating a fire, after it restarts on the same journal."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from typing import Any

import aiohttp
import orjson
import pytest

from shadowpod.api.models import CreateSession, ScheduleSpec
from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import CONTROL, RunningGateway, Session, StartGateway, call

# The shortest period a schedule may have.
EVERY_S = 1.0


async def fires(url: str, session: str, at_least: int) -> list[dict[str, Any]]:
    """The fire entries journaled, once there are at least ``at_least``."""
    async with GatewayClient(url) as client, asyncio.timeout(10 + at_least * EVERY_S):
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
    before = await fires(first.url, "s", 2)
    metrics = (await call(http, "GET", f"{first.url}/metrics")).text
    await first.stop()

    second = await start_gateway()
    after = await fires(second.url, "s", len(before) + 2)

    set_seq = 1
    for entry in after:
        assert entry["id"] == f"schedule:tick:{set_seq}:{entry['payload']['fire_no']}"
        assert entry["epoch"] == 0  # inbound: delivered to whoever owns the session
        assert entry["payload"]["content"] == "tock"
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
    fired = await fires(gateway.url, "s", 2)

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
            CreateSession(session="s", schedules=[ScheduleSpec(schedule_id="t", every_s=EVERY_S)])
        )
        await asyncio.sleep(1.5 * EVERY_S)
        page = await control.events("s", kinds=["schedule"])
    assert [e["payload"]["op"] for e in page.events] == ["set"]


@pytest.mark.parametrize(
    ("schedule", "loc"),
    [
        ({"schedule_id": "t", "every_s": 0.05}, "schedules.0.every_s"),  # a busy loop
        ({"schedule_id": "t", "every_s": 1e300}, "schedules.0.every_s"),  # past the calendar
        ({"schedule_id": "t", "every_s": 0}, "schedules.0.every_s"),
        ({"schedule_id": "t", "every_s": "60"}, "schedules.0.every_s"),
        ({"schedule_id": "t", "every_s": True}, "schedules.0.every_s"),
        ({"schedule_id": "t", "every_s": 60, "content": "x" * 16_385}, "schedules.0.content"),
    ],
)
async def test_a_schedule_out_of_bounds_is_refused_naming_its_field(
    gateway: RunningGateway, http: aiohttp.ClientSession, schedule: dict[str, Any], loc: str
) -> None:
    body = {"session": "s", "schedules": [schedule]}
    refused = await call(http, "POST", f"{gateway.url}/v1/sessions", token=CONTROL, json=body)
    assert (refused.status, refused.reason) == (400, "InvalidRequest")
    assert refused.locs == [loc]
    missing = await call(http, "GET", f"{gateway.url}/v1/sessions/s", token=CONTROL)
    assert missing.status == 404  # nothing was created


async def test_a_session_has_at_most_32_schedules(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    many = [{"schedule_id": f"t{n}", "every_s": 60} for n in range(33)]
    body = {"session": "s", "schedules": many}
    refused = await call(http, "POST", f"{gateway.url}/v1/sessions", token=CONTROL, json=body)
    assert (refused.status, refused.locs) == (400, ["schedules"])
    body["schedules"] = many[:32]
    created = await call(http, "POST", f"{gateway.url}/v1/sessions", token=CONTROL, json=body)
    assert created.status == 201


async def test_an_owner_schedule_out_of_bounds_is_refused_both_ways_in(
    gateway: RunningGateway, http: aiohttp.ClientSession, owned: Session
) -> None:
    tiny = {"kind": "schedule", "payload": {"schedule_id": "t", "op": "set", "every_s": 0.001}}
    refused = await call(
        http,
        "POST",
        f"{gateway.url}/v1/sessions/{owned.name}/journal",
        token=owned.agent_token,
        json={"epoch": 1, "entries": [tiny]},
    )
    assert (refused.status, refused.reason) == (400, "InvalidRequest")
    assert refused.locs == ["entries.0.payload.every_s"]
    async with http.ws_connect(
        f"{gateway.url}/v1/sessions/{owned.name}/owner/channel",
        params={"epoch": 1, "after": 0},
        headers={"Authorization": f"Bearer {owned.agent_token}"},
    ) as ws:
        await ws.send_bytes(orjson.dumps({"op": "append", "id": 1, "entries": [tiny]}))
        async with asyncio.timeout(5):
            while (frame := orjson.loads((await ws.receive()).data))["op"] != "error":
                pass
    assert (frame["status"], frame["reason"]) == (400, "InvalidRequest")
    assert [e["loc"] for e in frame["errors"]] == ["entries.0.payload.every_s"]
    schedules = await call(
        http,
        "GET",
        f"{gateway.url}/v1/sessions/{owned.name}/events",
        token=CONTROL,
        params={"kinds": "schedule"},
    )
    assert schedules.json["events"] == []
