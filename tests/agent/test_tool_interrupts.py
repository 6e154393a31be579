"""A tool call that stops to ask (a framework's interrupt, such as LangGraph's
``interrupt()``) is journaled as ``interrupted``: not an error, not an uncertain side
effect. Run again under the same call id (its turn redone by a new owner), it journals
a new intent first: had the owner died in that run, the call would be uncertain again
and a new owner would not repeat it. Over a real SQLite journal store, in process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from shadowpod.agent import ToolAbandoned, Turn
from shadowpod.bench.inprocess import InProcessOwner
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.state import CallStatus
from shadowpod.journal.sqlite.store import SQLiteJournalStore

SESSION = "s"


class Asked(Exception):
    """What the framework raises to stop and ask."""


class Owner(InProcessOwner):
    """Turns on the folded state, their outputs appended durably and folded back."""

    def __init__(self, store: SQLiteJournalStore) -> None:
        super().__init__(store, SESSION, instance="test")

    async def turn(self, action: Callable[[Turn], Awaitable[Any]]) -> Any:
        _, turn = await self.open_turn("x")
        return await action(turn)

    async def journal(self) -> list[JournalEntry]:
        entries: list[JournalEntry] = []
        while page := await self.store.read(SESSION, after=entries[-1].seq if entries else 0):
            entries += page
        return entries


@asynccontextmanager
async def owner(tmp_path: Path) -> AsyncIterator[Owner]:
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        yield Owner(store)
    finally:
        await store.close()


def call(run: Callable[[], Awaitable[JsonValue]]) -> Callable[[Turn], Awaitable[JsonValue]]:
    async def action(turn: Turn) -> JsonValue:
        return await turn.call(
            "c1", "send", {"to": "bob"}, run, idempotent=False, interrupts=(Asked,)
        )

    return action


async def test_an_interrupted_call_is_not_an_error_and_runs_again_as_a_new_intent(
    tmp_path: Path,
) -> None:
    async with owner(tmp_path) as driver:

        async def ask() -> JsonValue:
            raise Asked("send it? yes or no")

        with pytest.raises(Asked):  # raised as it is: the framework stops to ask
            await driver.turn(call(ask))
        asked = driver.folder.peek().tools.calls["c1"]
        assert asked.status is CallStatus.INTERRUPTED
        assert driver.folder.peek().tools.uncertain() == []

        during: list[CallStatus] = []

        async def send() -> JsonValue:
            during.append(driver.folder.peek().tools.calls["c1"].status)
            return "sent"

        assert await driver.turn(call(send)) == "sent"
        # While it ran again, the call was uncertain: a death there is not repeated.
        assert during == [CallStatus.PENDING]
        assert driver.folder.peek().tools.calls["c1"].status is CallStatus.OK

        async def never() -> JsonValue:
            raise AssertionError("a finished call is answered from the journal")

        assert await driver.turn(call(never)) == "sent"
        journal = await driver.journal()

    kinds = [
        (e.kind, e.payload.get("status"))
        for e in journal
        if e.kind in (EntryKind.TOOL_CALL, EntryKind.TOOL_RESULT)
    ]
    assert kinds == [
        (EntryKind.TOOL_CALL, None),
        (EntryKind.TOOL_RESULT, "interrupted"),
        (EntryKind.TOOL_CALL, None),
        (EntryKind.TOOL_RESULT, "ok"),
    ]


async def test_a_call_cut_short_after_its_interrupt_is_not_repeated(tmp_path: Path) -> None:
    async with owner(tmp_path) as driver:

        async def ask() -> JsonValue:
            raise Asked("send it?")

        with pytest.raises(Asked):
            await driver.turn(call(ask))

        async def dies() -> JsonValue:
            raise KeyboardInterrupt  # the owner goes down mid-run: no result journaled

        with pytest.raises(KeyboardInterrupt):
            await driver.turn(call(dies))

        async def again() -> JsonValue:
            raise AssertionError("the side effect may have happened: never repeated")

        with pytest.raises(ToolAbandoned):
            await driver.turn(call(again))
