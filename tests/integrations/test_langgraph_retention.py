"""Checkpoints pruned: a ``ShadowpodSaver(keep=N)`` keeps the N newest checkpoints of a
thread and the head of every branch. Over a real journal store, the state it leaves
stays bounded however long the conversation (but for the conversation itself),
``get_state_history`` lists what is kept, right, and an interrupt left on another
branch by a fork is still answered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command

from shadowpod.agent import Turn
from shadowpod.bench.langgraph import SESSION, _build_graph, _Owner
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations.langgraph import ROOT, ShadowpodSaver
from shadowpod.integrations.langgraph.retention import slack
from shadowpod.journal.sqlite.store import SQLiteJournalStore

CONFIG: Any = {"configurable": {"thread_id": "main"}}


class Owner(_Owner):
    """The benchmark's in-process owner, able to run any action as a turn."""

    async def within(self, action: Callable[[Turn], Awaitable[Any]]) -> Any:
        seq, turn = await self.open_turn("(action)")
        result = await action(turn)
        await self.close_turn(seq, turn)
        return result

    def values(self) -> dict[str, Any]:
        return dict(self.folder.peek().agent.values)


@asynccontextmanager
async def owner(tmp_path: Path, saver: ShadowpodSaver) -> AsyncIterator[tuple[Owner, Any]]:
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        graph = _build_graph()(saver)
        yield Owner(store, graph, saver), graph
    finally:
        await store.close()


def overhead(values: dict[str, Any]) -> int:
    """Bytes of the checkpoints' state but for the conversation (the messages' logs)
    and the empty buckets (at most ``BUCKETS`` per map, made as hashes first land)."""
    thread = values[ROOT]["main"][""]
    rest = {**thread, "channels": {**thread["channels"]}}
    rest["channels"].pop("messages")
    return len(orjson.dumps(_without_empty(rest)))


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v != {}}
    return value


def stored_checkpoints(values: dict[str, Any]) -> int:
    return sum(len(held) for held in values[ROOT]["main"][""]["checkpoints"].values())


async def test_storage_stays_bounded_and_history_lists_what_is_kept(tmp_path: Path) -> None:
    keep, turns = 24, 150
    saver = ShadowpodSaver(keep=keep)
    sizes: list[int] = []
    async with owner(tmp_path, saver) as (driver, _):
        for n in range(turns):
            await driver.turn(f"message {n:03d}")
            sizes.append(overhead(driver.values()))
            assert stored_checkpoints(driver.values()) <= keep + slack(keep)
        entries: list[JournalEntry] = []
        while page := await driver.store.read(SESSION, after=entries[-1].seq if entries else 0):
            entries += page

    # Past the first pruning, the checkpoints' own state does not grow with the turns
    # (kept, it would grow by ~2.6 KB a turn; what varies is the digits of numbers).
    assert max(sizes[-30:]) <= max(sizes[40:70]) + 1024, (sizes[40:70], sizes[-30:])
    # A new owner folding the journal reads the same: the conversation whole, the
    # history the kept checkpoints, newest first, each a prefix of the latest.
    state = fold(SessionState(), entries)
    assert state.extensions == []
    graph = _build_graph()(ShadowpodSaver(values=state.agent.values, keep=keep))
    history = list(graph.get_state_history(CONFIG))
    latest = history[0].values["messages"]
    assert [m.text for m in latest[::2]] == [f"message {n:03d}" for n in range(turns)]
    assert keep <= len(history) <= keep + slack(keep)
    ids = [s.config["configurable"]["checkpoint_id"] for s in history]
    assert ids == sorted(ids, reverse=True)
    for snapshot in history:
        messages = snapshot.values.get("messages", [])
        assert [m.id for m in messages] == [m.id for m in latest[: len(messages)]]
    assert len(history[-1].values["messages"]) >= 2 * turns - keep  # only the oldest went


async def test_an_interrupt_left_on_a_branch_by_a_fork_is_kept_and_answered(
    tmp_path: Path,
) -> None:
    keep = 4
    saver = ShadowpodSaver(keep=keep)
    async with owner(tmp_path, saver) as (driver, graph):
        for n in range(3):
            await driver.turn(f"hello {n}")
        await driver.turn("approve launch")  # stops to ask

        async def look(turn: Turn) -> tuple[Any, Any]:
            with saver.bound(turn):  # a saver reads the state of the turn it is in
                asked = await graph.aget_state(CONFIG)
                history = [s async for s in graph.aget_state_history(CONFIG)]
            assert asked.interrupts
            # The end of the last turn before the question: where the fork starts.
            before = next(s for s in history if not s.next and not s.interrupts)
            return asked.config, before.config

        asked, before = await driver.within(look)

        async def fork(turn: Turn) -> Any:
            with saver.bound(turn):
                new = {"messages": [HumanMessage("another way", id="fork")]}
                return await graph.ainvoke(new, before, durability="sync")

        await driver.within(fork)
        for n in range(30):  # the new branch goes on: old checkpoints are pruned
            await driver.turn(f"on the branch {n}")
        assert stored_checkpoints(driver.values()) <= keep + slack(keep) + 2

        async def answer(turn: Turn) -> Any:
            with saver.bound(turn):
                return await graph.ainvoke(Command(resume="yes"), asked, durability="sync")

        answered = await driver.within(answer)
    assert answered["messages"][-1].text == "approved: launch"
    assert [m.text for m in answered["messages"] if m.type == "human"] == [
        "hello 0",
        "hello 1",
        "hello 2",
        "approve launch",
    ]


def test_keep_must_keep_something() -> None:
    with pytest.raises(ValueError, match="keep at least the newest checkpoint"):
        ShadowpodSaver(keep=0)
