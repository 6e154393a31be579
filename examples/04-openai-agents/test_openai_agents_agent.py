"""The OpenAI Agents SDK example, run for real: a gateway with SQLite, the agent as
processes, the migration engine moving the live session while a user keeps talking;
then an owner killed between an email's effect and its result."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from shadowpod.api.models import OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.engine.ports import InstanceSpec
from shadowpod.engine.record import InstanceRef, MigrationPolicy, Phase
from shadowpod.integrations.openai_agents import JournaledSession
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import ImageMap

HERE = Path(__file__).parent
AGENT = HERE / "agent.py"
SESSION = "oa"


def images(workdir: Path) -> ImageMap:
    env = {"TOOL_LOG": "{here}/tools.log", "SHADOWPOD_SNAPSHOT_EVERY": "0"}

    def image(version: str, **extra: str) -> dict[str, Any]:
        return {
            "command": ["{python}", str(AGENT), "--version", version],
            "env": {**env, **extra},
            # Declared, so a move does not start the image once just to ask it.
            "state_schema": 1,
        }

    return ImageMap.from_data(
        {
            "images": {
                "oa:v1": image("1"),
                "oa:v2": image("2"),
                "oa:v1-slow-email": image("1", EMAIL_DELAY_S="300"),
            }
        },
        here=workdir,
    )


async def read_journal(admin: GatewayClient) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    while True:
        page, head = await admin.journal(SESSION, after=entries[-1].seq if entries else 0)
        entries += page
        if not page or entries[-1].seq >= head:
            return entries


def replies(entries: list[JournalEntry]) -> dict[int, list[JournalEntry]]:
    by_turn: dict[int, list[JournalEntry]] = {}
    for entry in entries:
        if entry.kind == EntryKind.MESSAGE and entry.payload.get("role") == "assistant":
            by_turn.setdefault(int(entry.payload["turn"]), []).append(entry)
    return by_turn


async def answered(admin: GatewayClient, seqs: list[int]) -> list[JournalEntry]:
    deadline = time.monotonic() + 60
    while True:
        entries = await read_journal(admin)
        if set(seqs) <= replies(entries).keys():
            return entries
        assert time.monotonic() < deadline, f"no reply to some of {seqs}"
        await asyncio.sleep(0.05)


def said(entries: list[JournalEntry], seq: int) -> str:
    (reply,) = replies(entries)[seq]
    return str(reply.payload["content"])


async def say(client: GatewayClient, content: str) -> int:
    return (await client.post_message(SESSION, content)).seq


def tool_runs(workdir: Path) -> list[str]:
    log = workdir / "tools.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.rsplit(" pid=", 1)[0] for line in lines]


async def items(entries: list[JournalEntry]) -> list[Any]:
    """The session's items, from the journal alone."""
    state = fold(SessionState(), entries)
    return await JournaledSession(values=state.agent.values).get_items()


async def test_the_agent_moves_under_load_and_every_message_is_answered_once(
    tmp_path: Path,
) -> None:
    async with LocalDeployment(tmp_path, images(tmp_path)) as dep, dep.client() as client:
        await dep.create_session(SESSION, image="oa:v1", instance="v1")
        opening = [await say(client, "hello"), await say(client, "email bob hi")]
        entries = await answered(dep.admin, opening)
        assert [said(entries, seq) for seq in opening] == [
            "you said: hello (1 messages so far)",
            "done: sent to bob",
        ]

        stop, during = asyncio.Event(), list[tuple[int, str]]()

        async def chatter() -> None:  # 20 messages a second, until stopped
            n = 0
            while not stop.is_set():
                n += 1
                during.append((await say(client, f"still here {n}"), f"still here {n}"))
                await asyncio.sleep(0.05)

        talking = asyncio.create_task(chatter())
        await asyncio.sleep(0.2)
        record = dep.plan(
            SESSION,
            source=InstanceRef(name="v1", image="oa:v1"),
            target_image="oa:v2",
            policy=MigrationPolicy(phase_timeout_s=30.0),
        )
        record = await dep.migrate(record)
        assert record.phase is Phase.SUCCEEDED, record.error
        await asyncio.sleep(0.2)
        stop.set()
        await talking
        last = await say(client, "how many?")
        entries = await answered(dep.admin, [*(seq for seq, _ in during), last])

    by_turn = replies(entries)
    user_turns = sorted([*opening, *(seq for seq, _ in during), last])
    assert sorted(by_turn) == user_turns
    assert all(len(by_turn[seq]) == 1 for seq in user_turns)
    versions = [by_turn[seq][0].payload["meta"]["version"] for seq in user_turns]
    assert versions == sorted(versions) and versions[0] == "1" and versions[-1] == "2"
    for seq, text in during:
        assert said(entries, seq).startswith(f"you said: {text} (")
    # The session's items hold every message once, in order: the count goes on.
    assert said(entries, last) == f"you said: how many? ({len(user_turns)} messages so far)"
    held = await items(entries)
    assert [i["content"] for i in held if i.get("role") == "user"][-1] == "how many?"
    assert tool_runs(tmp_path) == ["email bob hi"]


async def test_an_email_cut_short_by_the_owners_death_is_never_sent_again(
    tmp_path: Path,
) -> None:
    async with LocalDeployment(tmp_path, images(tmp_path)) as dep, dep.client() as client:
        await dep.create_session(SESSION, image="oa:v1-slow-email", instance="v1")
        await answered(dep.admin, [await say(client, "hello")])
        email = await say(client, "email carol Rome")
        deadline = time.monotonic() + 20
        while "email carol Rome" not in tool_runs(tmp_path):
            assert time.monotonic() < deadline, "the email never started"
            await asyncio.sleep(0.05)
        await dep.runtime.kill("v1")  # kill -9, between the effect and its result
        await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="v2"))
        await dep.runtime.start(
            InstanceSpec(name="v2", image="oa:v2", session=SESSION, mode="owner", epoch=2)
        )
        await dep.wait_serving("v2")
        after = await say(client, "still there?")
        entries = await answered(dep.admin, [email, after])

    # The new owner did not ask the model for the call again (it would have named it
    # anew): it answered the call it found saved, from the journal.
    assert said(entries, email).startswith("done: Not run again: "), said(entries, email)
    assert tool_runs(tmp_path) == ["email carol Rome"]
    assert said(entries, after) == "you said: still there? (3 messages so far)"
    held = await items(entries)
    calls = [i["call_id"] for i in held if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in held if i.get("type") == "function_call_output"]
    assert len(calls) == 1 and calls == outputs
