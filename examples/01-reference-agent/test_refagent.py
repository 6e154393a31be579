"""The reference agent, run for real: v1 serves a conversation, the migration engine
moves the live session to v2 (ShadowPod + ExchangeFence) while a client keeps
talking, and v2 carries on from v1's state.

Real processes throughout: a gateway with SQLite, the agents as subprocesses, the
engine driving them through the local runtime.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import fold
from shadowpod.domain.schema import load_state
from shadowpod.domain.state import SessionState
from shadowpod.engine.record import InstanceRef, Phase
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images

SESSION = "s"
V1 = "s-v1"
CONVERSATION = [
    "my name is Ada",
    "weather Oslo",
    "remember: never deploy on friday",
    "what do you know?",
]
# "[v1] #4 ..." or "v2 > turn 5: ...": which version answered, and its turn count.
COUNTED = re.compile(r"^(?:\[v1\] #(?P<v1>\d+) |v2 > turn (?P<v2>\d+): )")


async def read_journal(admin: GatewayClient) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    while True:
        page, head = await admin.journal(SESSION, after=entries[-1].seq if entries else 0)
        entries += page
        if not page or entries[-1].seq >= head:
            return entries


def replies(entries: list[JournalEntry]) -> dict[int, list[JournalEntry]]:
    """Assistant replies by the inbound seq of their turn."""
    by_turn: dict[int, list[JournalEntry]] = {}
    for entry in entries:
        if entry.kind == EntryKind.MESSAGE and entry.payload.get("role") == "assistant":
            by_turn.setdefault(int(entry.payload["turn"]), []).append(entry)
    return by_turn


async def wait_answered(admin: GatewayClient, seqs: list[int]) -> list[JournalEntry]:
    deadline = time.monotonic() + 20
    while True:
        entries = await read_journal(admin)
        if set(seqs) <= replies(entries).keys():
            return entries
        assert time.monotonic() < deadline, f"no reply to some of {seqs}"
        await asyncio.sleep(0.02)


async def say(client: GatewayClient, content: str) -> int:
    return (await client.post_message(SESSION, content)).seq


async def chatter(client: GatewayClient, stop: asyncio.Event, sent: list[int]) -> None:
    """A user who keeps talking, one message every 50 ms, until ``stop``."""
    n = 0
    while not stop.is_set():
        n += 1
        sent.append(await say(client, f"still here {n}"))
        await asyncio.sleep(0.05)


async def agent_json(dep: LocalDeployment, instance: str, path: str) -> Any:
    """GET one of an agent instance's own endpoints."""
    found = dep.runtime.instance(instance)
    assert found is not None
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{found.url}{path}", timeout=aiohttp.ClientTimeout(total=5)) as response,
    ):
        assert response.status == 200
        return await response.json()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def state_at_head(dep: LocalDeployment, instance: str) -> SessionState:
    """The instance's folded state once it has caught up with the journal's head
    (it applies its own last append a moment after clients can see it)."""
    head = (await dep.admin.status(SESSION)).head
    for _ in range(200):
        state = load_state(await agent_json(dep, instance, "/v1/state"))
        if state.watermark >= head:
            return state
        await asyncio.sleep(0.02)
    raise AssertionError(f"{instance} did not catch up with seq {head}")


async def talk_to_v1(dep: LocalDeployment, client: GatewayClient) -> list[int]:
    """Start the session on v1 and have the conversation; the inbound seqs."""
    await dep.create_session(SESSION, image="refagent:v1", instance=V1)
    conversation = [await say(client, text) for text in CONVERSATION]
    entries = await wait_answered(dep.admin, conversation)
    assert [replies(entries)[seq][0].payload["content"] for seq in conversation] == [
        "[v1] #1 nice to meet you (hi Ada)",
        "[v1] #2 weather: {'city': 'Oslo', 'forecast': 'snow'} (hi Ada)",
        "[v1] #3 I will remember: never deploy on friday (hi Ada)",
        "[v1] #4 what do you know? (hi Ada)",
    ]
    return conversation


async def test_a_live_session_moves_from_v1_to_v2_and_keeps_its_state(tmp_path: Path) -> None:
    async with (
        LocalDeployment(tmp_path, reference_images()) as dep,
        dep.client() as client,
    ):
        conversation = await talk_to_v1(dep, client)

        # The user keeps talking while the engine moves the session to v2.
        stop = asyncio.Event()
        during: list[int] = []
        talking = asyncio.create_task(chatter(client, stop, during))
        await asyncio.sleep(0.2)
        record = dep.plan(
            SESSION,
            source=InstanceRef(name=V1, image="refagent:v1"),
            target_image="refagent:v2",
        )
        record = await dep.migrate(record)
        await asyncio.sleep(0.2)
        stop.set()
        await talking
        assert record.phase is Phase.SUCCEEDED, record.error
        v2 = record.spec.target.name

        last = await say(client, "hello again")
        entries = await wait_answered(dep.admin, [*during, last])
        by_turn = replies(entries)

        # v2 answers, still knows the name v1 learned, and counts on from v1.
        (answer,) = by_turn[last]
        turns = len(CONVERSATION) + len(during) + 1
        assert answer.payload["content"] == f"v2 > turn {turns}: hello again (hi Ada)"
        assert (answer.epoch, answer.payload["meta"]["instance"]) == (2, v2)

        # Every message was answered exactly once, by exactly one version: v1 until the
        # move, v2 after it, with the turn count running on without a gap or a repeat.
        user_turns = sorted([*conversation, *during, last])
        assert sorted(by_turn) == user_turns
        assert all(len(by_turn[seq]) == 1 for seq in user_turns)
        versions, counts = [], []
        for seq in user_turns:
            (reply,) = by_turn[seq]
            found = COUNTED.match(reply.payload["content"])
            assert found is not None, reply.payload["content"]
            version = "1" if found["v1"] else "2"
            assert reply.payload["meta"]["version"] == version
            assert reply.epoch == int(version)  # v1 owned epoch 1, v2 epoch 2
            versions.append(version)
            counts.append(int(found["v1"] or found["v2"]))
        assert versions == sorted(versions) and versions[-1] == "2"
        assert counts == list(range(1, turns + 1))

        # v2's state: v1's memory and fact, and v1's own state migrated to schema 2.
        state = await state_at_head(dep, v2)
        assert state.memory["name"] == "Ada"
        assert [f.text for f in state.facts.values()] == ["never deploy on friday"]
        assert state.agent.schema_version == 2
        assert state.agent.values == {"turns": {"count": turns}, "profile": {"greeted": False}}
        # The journal alone says the same: state is a fold of it.
        journaled = fold(SessionState(), entries)
        assert journaled.memory == state.memory and journaled.facts == state.facts

        # v1 drained its background indexer and left; v2 runs its own.
        source = dep.runtime.instance(V1)
        assert source is not None and source.process.returncode == 0
        drained = [
            e for e in entries if e.kind == EntryKind.CONTROL and e.payload["event"] == "drained"
        ]
        assert [(e.payload["owner"], e.payload["epoch"]) for e in drained] == [(V1, 1)]
        processes = [e for e in entries if e.kind == EntryKind.PROCESS]
        started = {e.epoch: e.payload["pid"] for e in processes if e.payload["op"] == "started"}
        assert started.keys() == {1, 2} and started[1] != started[2]
        ended = [(e.payload["op"], e.payload["pid"]) for e in processes if e not in drained]
        assert ("terminated", started[1]) in ended
        assert not alive(started[1])
        status = await agent_json(dep, v2, "/v1/status")
        assert status["processes"] == [{"name": "indexer", "pid": started[2], "running": True}]


async def test_a_stop_and_recreate_move_to_v2_carries_the_state_over_too(tmp_path: Path) -> None:
    """The baseline strategy: stop v1, start v2 as the owner at the next epoch. v2
    takes over from the journal and brings v1's own state to its schema as it does."""
    async with (
        LocalDeployment(tmp_path, reference_images()) as dep,
        dep.client() as client,
    ):
        await talk_to_v1(dep, client)
        record = dep.plan(
            SESSION,
            source=InstanceRef(name=V1, image="refagent:v1"),
            target_image="refagent:v2",
            strategy="restart",
        )
        record = await dep.migrate(record)
        assert record.phase is Phase.SUCCEEDED, record.error
        v2 = record.spec.target.name

        last = await say(client, "hello again")
        entries = await wait_answered(dep.admin, [last])
        (answer,) = replies(entries)[last]
        turns = len(CONVERSATION) + 1
        assert answer.payload["content"] == f"v2 > turn {turns}: hello again (hi Ada)"
        assert (answer.epoch, answer.payload["meta"]["instance"]) == (2, v2)

        # v1's state in v2's schema, and nothing of v1's shape left over.
        expected = {"turns": {"count": turns}, "profile": {"greeted": False}}
        state = await state_at_head(dep, v2)
        assert (state.agent.values, state.agent.schema_version) == (expected, 2)
        journaled = fold(SessionState(), entries)
        assert (journaled.agent.values, journaled.agent.schema_version) == (expected, 2)
        assert [f.text for f in journaled.facts.values()] == ["never deploy on friday"]
