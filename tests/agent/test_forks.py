"""Forks with real agents: a fork at seq N answers from its parent's state at N, the
parent serving on untouched under client load; a side effect done before the fork
point is not done again by the fork (its tool ledger says it happened)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from shadowpod.api.models import ForkFrom
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.payloads import EntryKind
from shadowpod.local.deployment import LocalDeployment
from tests.agent.support import (
    SESSION,
    lines_of,
    of_kind,
    post,
    read_journal,
    replies,
    replies_to,
    wait_answered,
    wait_for,
)


async def test_a_fork_answers_from_the_parents_state_at_the_fork_point(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await dep.create_session(SESSION, image="surfaces:1", instance="parent-1")
    first = [await post(client, "count") for _ in range(2)]
    await wait_answered(dep.admin, first)
    requested = await dep.admin.request_snapshot(SESSION)
    third = await post(client, "count")
    entries = await wait_answered(dep.admin, [third])
    await wait_for(
        lambda: _snapshot_at_least(dep, requested), "the parent's snapshot", timeout_s=15
    )
    fork_seq = entries[-1].seq  # the parent has counted to 3 here
    await wait_answered(dep.admin, [await post(client, "count") for _ in range(2)])  # 5

    sent: list[int] = []
    stop = asyncio.Event()

    async def load() -> None:  # a client keeps the parent busy through the fork
        while not stop.is_set():
            sent.append(await post(client, "count"))
            await asyncio.sleep(0.05)

    loader = asyncio.create_task(load())
    try:
        await dep.create_session(
            "f1",
            image="surfaces:1",
            instance="fork-1",
            fork_from=ForkFrom(session=SESSION, seq=fork_seq),
        )
        asked = await post(client, "count", session="f1")
        forked = await wait_answered(dep.admin, [asked], session="f1")
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await loader
    (reply,) = replies_to(forked, asked)
    assert reply.payload["content"] == "count 4"
    assert reply.payload["meta"]["instance"] == "fork-1"
    parent_prefix = [(e.seq, e.id, e.payload) for e in entries if e.seq <= fork_seq]
    assert [(e.seq, e.id, e.payload) for e in forked if e.seq <= fork_seq] == parent_prefix

    # The parent: every message answered once, in order, by its own owner, counting on.
    parent = await wait_answered(dep.admin, sent)
    counts = [r.payload["content"] for r in replies(parent)]
    assert counts == [f"count {n}" for n in range(1, 6 + len(sent))]
    assert {r.payload["meta"]["instance"] for r in replies(parent)} == {"parent-1"}
    assert [(e.seq, e.id, e.payload) for e in parent if e.seq <= fork_seq] == parent_prefix
    assert not [e for e in parent if (e.payload.get("meta") or {}).get("instance") == "fork-1"]


async def _snapshot_at_least(dep: LocalDeployment, seq: int) -> int | None:
    latest = (await dep.admin.status(SESSION)).latest_snapshot
    return latest if latest is not None and latest >= seq else None


async def test_a_side_effect_before_the_fork_point_is_not_done_again(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    side_effects = tmp_path / "sidefx.log"
    await dep.create_session(SESSION, image="sidefx:fast", instance="parent-1")
    turn = await post(client, "book table-for-two")
    entries = await wait_answered(dep.admin, [turn])
    (intent,) = of_kind(entries, EntryKind.TOOL_CALL)
    (result,) = of_kind(entries, EntryKind.TOOL_RESULT)
    assert len(lines_of(side_effects)) == 1

    # Forked after the tool's result, before the turn's reply: the fork redoes the
    # turn from its ledger. Forked after the intent only: the outcome is unknown, and a
    # call that is not idempotent is not repeated blindly.
    await dep.create_session(
        "after-result",
        image="sidefx:fast",
        instance="fork-a",
        fork_from=ForkFrom(session=SESSION, seq=result.seq),
    )
    await dep.create_session(
        "after-intent",
        image="sidefx:fast",
        instance="fork-b",
        fork_from=ForkFrom(session=SESSION, seq=intent.seq),
    )
    done = await wait_answered(dep.admin, [turn], session="after-result")
    (reply,) = replies_to(done, turn)
    assert reply.payload["content"].startswith("book done:")
    assert reply.payload["meta"]["instance"] == "fork-a"
    assert [e.seq for e in of_kind(done, EntryKind.TOOL_RESULT)] == [result.seq]
    uncertain = await wait_answered(dep.admin, [turn], session="after-intent")
    (abandoned,) = of_kind(uncertain, EntryKind.TOOL_RESULT)
    assert abandoned.payload["status"] == "abandoned"

    # The side effect happened once, by the parent's owner; the parent is as it was.
    (line,) = lines_of(side_effects)
    assert line.startswith("book table-for-two ")
    assert [e.seq for e in await read_journal(dep.admin)] == [e.seq for e in entries]
