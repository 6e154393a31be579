"""Three gateway processes on one PostgreSQL journal (``gateway/placement.py``).

Clients post through random replicas, the owner talks to one, the fence is called
through a third: whichever replica a request reaches, the session's lease holder
serves it. Killing the holder with SIGKILL under load loses, doubles and reorders
nothing, and another replica serves the session within the lease time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from shadowpod.api.models import CreateSession, FenceRequest, OwnershipChange, ScheduleSpec
from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.local.gateway_process import GatewayProcess, free_port
from tests.conftest import PG_DSN, drop_pg_schema, postgres_unavailable

pytestmark = pytest.mark.postgres
TTL_S = 3.0
SESSION = "chat"


@dataclass
class Replicas:
    processes: list[GatewayProcess]
    schema: str
    token: str
    dead: set[int] = field(default_factory=set)

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.processes]

    def alive(self) -> list[int]:
        return [n for n in range(len(self.processes)) if n not in self.dead]

    async def holder(self) -> str | None:
        async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
            row = await (
                await conn.execute(
                    f"SELECT holder FROM {self.schema}.leases "
                    "WHERE session = %s AND expires > clock_timestamp()",
                    (SESSION,),
                )
            ).fetchone()
        return None if row is None else str(row[0])


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    if reason := postgres_unavailable():
        pytest.skip(reason)
    schema = f"test_{uuid.uuid4().hex[:12]}"
    token = secrets.token_urlsafe(24)
    processes = []
    for n in range(3):
        port = free_port()
        processes.append(
            GatewayProcess(
                tmp_path / f"gw{n}",
                journal_url=f"{PG_DSN}?shadowpod_schema={schema}",
                port=port,
                control_token=token,
                extra_args=(
                    "--advertise-url",
                    f"http://127.0.0.1:{port}",
                    "--replica-id",
                    f"gw{n}",
                    "--lease-ttl",
                    str(TTL_S),
                ),
            )
        )
    try:
        for process in processes:
            await process.start()
        yield Replicas(processes, schema, token)
    finally:
        for process in processes:
            await process.stop()
        drop_pg_schema(schema)


def _reply(turn: int) -> list[NewEntry]:
    return [
        NewEntry(
            id=f"reply:{turn}",
            kind="message",
            payload={"role": "assistant", "content": f"re {turn}", "turn": turn},
        ),
        NewEntry(id=f"ack:{turn}", kind="ack", payload={"turn": turn}),
    ]


class Owner:
    """An owner at ``epoch`` answering every inbound message released to it, reaching
    the gateway through ``pick()`` (another replica when one stops answering)."""

    def __init__(
        self, replicas: Replicas, agent_token: str, epoch: int, after: int, think_s: float = 0
    ) -> None:
        self.replicas = replicas
        self.think_s = think_s  # a turn takes this long: a fence finds one in progress
        self.processed: list[int] = []  # turns it did the work of (answered or not)
        self.refused: list[int] = []  # ... whose answer the journal refused: work lost
        self.agent_token = agent_token
        self.epoch = epoch
        self.after = after
        self.fenced = False
        self.index = replicas.alive()[0]

    async def run(self) -> None:
        released = 0
        while True:
            if self.index in self.replicas.dead:
                self.index = random.choice(self.replicas.alive())
            url = self.replicas.urls[self.index]
            async with GatewayClient(url, self.agent_token, timeout_s=10) as agent:
                try:
                    entries, released = await agent.owner_entries(
                        SESSION, epoch=self.epoch, after=self.after, released=released, wait_s=1
                    )
                    for entry in entries:
                        if _inbound(entry) and entry.seq <= released:
                            self.processed.append(entry.seq)
                            await asyncio.sleep(self.think_s)
                            try:
                                await agent.append(
                                    SESSION, epoch=self.epoch, entries=_reply(entry.seq)
                                )
                            except GatewayError as exc:
                                if exc.reason == "Fenced":
                                    self.refused.append(entry.seq)
                                raise
                        if entry.seq > released:
                            break
                        self.after = entry.seq
                except GatewayError as exc:
                    if exc.reason == "Fenced":
                        self.fenced = True
                        return
                    if exc.status != 503:
                        raise
                    await asyncio.sleep(0.1)
                except (OSError, TimeoutError):  # the replica died: another one
                    await asyncio.sleep(0.1)
                    self.index = random.choice(self.replicas.alive())


def _summary(entries: list[JournalEntry]) -> str:
    """The journal in one line, for a failure's message."""
    return " ".join(
        f"{e.seq}:{e.kind}@{e.epoch}:{e.payload.get('turn', e.payload.get('content', ''))}"
        for e in entries
    )


def _inbound(entry: JournalEntry) -> bool:
    return entry.kind == "message" and entry.epoch == 0 and entry.payload.get("role") == "user"


async def _post(replicas: Replicas, n: int) -> float:
    """Post message ``n`` through a random live replica until one accepts it (the same
    id each time: a repeat is absorbed); how long that took."""
    started = time.monotonic()
    while True:
        url = replicas.urls[random.choice(replicas.alive())]
        async with GatewayClient(url, timeout_s=10) as client:  # no client tokens set
            try:
                await client.post_message(SESSION, f"m{n}", id=f"m{n}")
                return time.monotonic() - started
            except GatewayError as exc:
                if exc.status != 503:
                    raise
            except (OSError, TimeoutError):
                pass
        await asyncio.sleep(0.05)


async def _all_acked(replicas: Replicas, agent_token: str, count: int) -> list[JournalEntry]:
    """The journal once every one of ``count`` messages is acked (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        entries = await _journal(replicas, agent_token)
        if len([e for e in entries if e.kind == "ack"]) == count:
            return entries
        assert time.monotonic() < deadline, _summary(entries)
        await asyncio.sleep(0.2)


async def _journal(replicas: Replicas, agent_token: str) -> list[JournalEntry]:
    url = replicas.urls[replicas.alive()[0]]
    async with GatewayClient(url, agent_token, timeout_s=30) as agent:
        entries, _ = await agent.journal(SESSION, after=0, limit=5_000)
        return entries


def _check_exactly_once_in_order(entries: list[JournalEntry], count: int) -> None:
    inbound = [e for e in entries if _inbound(e)]
    assert [e.payload["content"] for e in inbound] == [f"m{n}" for n in range(count)]
    acks = [e.payload["turn"] for e in entries if e.kind == "ack"]
    assert acks == [e.seq for e in inbound]  # each processed once, in order, none lost
    replies = [e.payload["turn"] for e in entries if e.kind == "message" and e.epoch > 0]
    assert replies == acks


async def _setup(replicas: Replicas) -> str:
    control = [GatewayClient(url, replicas.token) for url in replicas.urls]
    try:
        created = await control[0].create_session(CreateSession(session=SESSION))
        await control[1].set_ownership(
            SESSION, OwnershipChange(expect_epoch=0, epoch=1, owner="pod-a")
        )
    finally:
        for client in control:
            await client.close()
    assert created.agent_token is not None
    return created.agent_token


async def test_requests_through_any_replica_reach_the_sessions_holder_and_the_fence_works(
    replicas: Replicas,
) -> None:
    agent_token = await _setup(replicas)
    old = Owner(replicas, agent_token, epoch=1, after=0, think_s=0.1)
    old.index = 2
    serving = asyncio.create_task(old.run())
    count = 40
    for n in range(count // 2):
        await _post(replicas, n)
    async with GatewayClient(replicas.urls[1], replicas.token) as control:
        fenced = await control.fence(
            SESSION, FenceRequest(expect_epoch=1, new_owner="pod-b", timeout_s=20)
        )
    await asyncio.wait_for(serving, 10)
    assert old.fenced
    # The new owner takes over from the last turn the old one finished.
    new = Owner(replicas, agent_token, epoch=2, after=fenced.acked)
    new.index = 0
    serving = asyncio.create_task(new.run())
    try:
        for n in range(count // 2, count):
            await _post(replicas, n)
        entries = await _all_acked(replicas, agent_token, count)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    _check_exactly_once_in_order(entries, count)
    assert not [e for e in entries if e.epoch == 1 and e.seq > fenced.fence_seq]
    # The fence, called through another replica than the owner's, waited for the turn
    # in progress: no work of the old owner was thrown away, none done twice.
    assert old.refused == []
    assert not set(old.processed) & set(new.processed)
    assert await replicas.holder() in {"gw0", "gw1", "gw2"}  # one holder served it all


async def test_the_holder_killed_under_load_loses_nothing_and_another_takes_over(
    replicas: Replicas,
) -> None:
    agent_token = await _setup(replicas)
    owner = Owner(replicas, agent_token, epoch=1, after=0)
    serving = asyncio.create_task(owner.run())
    count, killed_at = 60, 20
    took: list[float] = []
    try:
        for n in range(killed_at):
            took.append(await _post(replicas, n))
        holder = await replicas.holder()
        assert holder is not None
        victim = int(holder.removeprefix("gw"))
        await replicas.processes[victim].stop(kill=True)
        replicas.dead.add(victim)
        for n in range(killed_at, count):
            took.append(await _post(replicas, n))
        entries = await _all_acked(replicas, agent_token, count)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    _check_exactly_once_in_order(entries, count)
    new_holder = await replicas.holder()
    assert new_holder is not None and new_holder != holder
    # The first post after the kill waited for the lease to expire: within the bound.
    assert took[killed_at] <= TTL_S + 2.0, took[killed_at]


async def test_a_holder_stopped_with_sigterm_hands_its_session_over_before_it_exits(
    replicas: Replicas,
) -> None:
    agent_token = await _setup(replicas)
    owner = Owner(replicas, agent_token, epoch=1, after=0)
    serving = asyncio.create_task(owner.run())
    count, stopped_at = 30, 15
    try:
        for n in range(stopped_at):
            await _post(replicas, n)
        holder = await replicas.holder()
        assert holder is not None
        victim = int(holder.removeprefix("gw"))
        replicas.dead.add(victim)
        await replicas.processes[victim].stop()  # SIGTERM, and wait for the exit
        # Released, not left to expire (it would be the victim's for the lease time):
        # free, or already taken by the replica the owner's next request reached.
        assert await replicas.holder() != holder
        for n in range(stopped_at, count):
            await _post(replicas, n)
        entries = await _all_acked(replicas, agent_token, count)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    _check_exactly_once_in_order(entries, count)
    assert await replicas.holder() not in (None, holder)


async def _fires(replicas: Replicas, at_least: int) -> list[dict[str, Any]]:
    """The schedule fires journaled, once there are at least ``at_least`` (read through a
    live replica; 30 s at most)."""
    async with asyncio.timeout(30):
        while True:
            url = replicas.urls[random.choice(replicas.alive())]
            async with GatewayClient(url, timeout_s=10) as client:
                try:
                    page = await client.events(SESSION, kinds=["schedule"], limit=1000)
                except GatewayError as exc:
                    if exc.status != 503:
                        raise
                    page = None
                except (OSError, TimeoutError):
                    page = None
            fired = [] if page is None else [e for e in page.events if e["payload"]["op"] == "fire"]
            if len(fired) >= at_least:
                return fired
            await asyncio.sleep(0.2)


async def _fired_here(url: str) -> float:
    """The replica's own count of the fires it journaled."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    found = re.search(r"^shadowpod_schedule_fires_total (\S+)$", text, re.M)
    assert found is not None, text
    return float(found.group(1))


async def test_only_the_lease_holder_fires_and_a_new_holder_goes_on_after_a_kill(
    replicas: Replicas,
) -> None:
    async with GatewayClient(replicas.urls[0], replicas.token) as control:
        await control.create_session(
            CreateSession(
                session=SESSION, schedules=[ScheduleSpec(schedule_id="tick", every_s=1.0)]
            )
        )
    before = await _fires(replicas, 4)
    holder = await replicas.holder()
    assert holder is not None
    victim = int(holder.removeprefix("gw"))
    others = [n for n in range(3) if n != victim]
    # Each replica fires every session it knows of unless only the holder may.
    assert [await _fired_here(replicas.urls[n]) for n in others] == [0, 0]
    assert await _fired_here(replicas.urls[victim]) >= len(before)

    await replicas.processes[victim].stop(kill=True)
    killed_at = datetime.now(UTC)
    replicas.dead.add(victim)
    fired = await _fires(replicas, len(before) + 4)

    numbers = [e["payload"]["fire_no"] for e in fired]
    assert len(set(numbers)) == len(numbers) and numbers == sorted(numbers), numbers
    assert fired[: len(before)] == before
    after = [e for e in fired if datetime.fromisoformat(e["ts"]) > killed_at]
    assert after, numbers
    # Takeover bound for fires: the lease time after the holder's last renewal, then at
    # most ttl/4 until a replica asks for the lease again and one firer tick (1 s).
    resumed_s = (datetime.fromisoformat(after[0]["ts"]) - killed_at).total_seconds()
    assert resumed_s <= TTL_S + TTL_S / 4 + 1.0 + 1.0, resumed_s  # + 1 s for this machine
    # Fires missed meanwhile are coalesced into one; none before the kill is repeated.
    skipped = after[0]["payload"]["fire_no"] - numbers[len(fired) - len(after) - 1] - 1
    assert 0 <= skipped <= resumed_s + 1, (skipped, numbers)
    assert [n - after[0]["payload"]["fire_no"] for n in numbers[-len(after) :]] == list(
        range(len(after))
    )
    new_holder = await replicas.holder()
    assert new_holder is not None and new_holder != holder
    counts = {n: await _fired_here(replicas.urls[n]) for n in others}
    assert counts[int(new_holder.removeprefix("gw"))] >= len(after)
    assert sorted(counts.values())[0] == 0, counts  # the third replica never fired
