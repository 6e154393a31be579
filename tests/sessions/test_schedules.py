"""One firer serves every session: no session's schedules may cost another its fires.

The firer runs on a real SQLite journal; time is a clock the test moves.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.payloads import MAX_SCHEDULE_PERIOD_S, SchedulePayload
from shadowpod.domain.schema import dump_state
from shadowpod.domain.state import Schedule, SessionState
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.sessions.schedules import (
    PAGE,
    PAGES_PER_TICK,
    ScheduleBook,
    ScheduleFirer,
    next_fire,
)


@dataclass
class FakeClock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def set_entry(schedule_id: str, every_s: float, content: str = "") -> NewEntry:
    payload = {"schedule_id": schedule_id, "op": "set", "every_s": every_s, "content": content}
    return NewEntry(kind="schedule", payload=payload)


async def fires(store: SQLiteJournalStore, session: str) -> list[dict[str, Any]]:
    entries = await store.read(session, 0, 100_000)
    return [
        {"id": e.id, **e.payload}
        for e in entries
        if e.kind == "schedule" and e.payload["op"] == "fire"
    ]


async def clock_at_set(store: SQLiteJournalStore, session: str) -> FakeClock:
    """A clock at the time the session's first schedule was set."""
    [first] = [e for e in await store.read(session, 0, 1000) if e.kind == "schedule"][:1]
    return FakeClock(first.ts)


async def put_state(store: SQLiteJournalStore, session: str, state: SessionState) -> None:
    head = await store.head(session)
    document = orjson.dumps(dump_state(state.model_copy(update={"watermark": head})))
    await store.put_snapshot(session, watermark=head, schema_version=3, document_json=document)


def schedule(schedule_id: str, every_s: float, anchor: datetime) -> Schedule:
    return Schedule(schedule_id=schedule_id, every_s=every_s, anchor=anchor, set_seq=1)


async def test_a_session_whose_schedules_cannot_be_worked_out_does_not_stop_the_others(
    store: SQLiteJournalStore,
) -> None:
    # A snapshot document is only checked to be a JSON object when it is stored: one
    # with a period of 1e300 s (its due time is past the calendar), and one of a state
    # schema this gateway cannot read.
    await store.append("s", [set_entry("tick", 1)], owner_epoch=1)
    clock = await clock_at_set(store, "s")
    for name in ("a-huge-period", "b-unreadable"):
        await store.create_session(name)
    await put_state(
        store, "a-huge-period", SessionState(schedules={"x": schedule("x", 1e300, clock.now)})
    )
    await store.put_snapshot(
        "b-unreadable",
        watermark=0,
        schema_version=99,
        document_json=b'{"schema_version": 99}',
    )
    firer = ScheduleFirer(store, clock=clock)
    # The broken sessions come first in the firer's book, where they used to stop it.
    firer.touch("a-huge-period")
    firer.touch("b-unreadable")
    await firer.tick()
    firer.touch("s")
    for _ in range(3):
        clock.advance(1)
        await firer.tick()
        await firer.tick()

    assert [f["fire_no"] for f in await fires(store, "s")] == [1, 2, 3]
    assert await fires(store, "a-huge-period") == []
    assert firer.failing() == {"b-unreadable"}


async def test_a_tiny_period_in_a_snapshot_is_held_to_a_second(store: SQLiteJournalStore) -> None:
    clock = FakeClock(datetime.fromisoformat("2026-03-01T00:00:00+00:00"))
    await put_state(store, "s", SessionState(schedules={"x": schedule("x", 1e-6, clock.now)}))
    firer = ScheduleFirer(store, clock=clock)
    firer.touch("s")
    clock.advance(10)
    for _ in range(101):  # a second, in ticks 10 ms apart
        await firer.tick()
        clock.advance(0.01)

    # The latest fire due (the ones missed before are coalesced), then one a second
    # later: not one at every tick, as fast as the loop runs.
    assert len(await fires(store, "s")) == 2
    assert await firer.tick() > 0


async def test_a_schedule_set_again_fires_again_and_the_firer_does_not_spin(
    store: SQLiteJournalStore,
) -> None:
    await store.append("s", [set_entry("tick", 1)], owner_epoch=1)
    clock = await clock_at_set(store, "s")
    firer = ScheduleFirer(store, clock=clock)
    firer.touch("s")
    for _ in range(3):
        clock.advance(1)
        await firer.tick()
        await firer.tick()
    # The agent sets it again (the same id, a new period): fires count from 1 again.
    await store.append("s", [set_entry("tick", 2)], owner_epoch=1)
    [reset] = [e for e in await store.read("s", 0, 1000) if e.kind == "schedule"][-1:]
    clock.now = reset.ts
    firer.touch("s")
    await firer.tick()
    clock.advance(2)
    delays = [await firer.tick() for _ in range(10)]

    journaled = await fires(store, "s")
    assert [f["fire_no"] for f in journaled] == [1, 2, 3, 1]  # the new fire 1 is journaled
    assert len({f["id"] for f in journaled}) == 4
    assert delays[-1] > 0  # waits for the next fire instead of retrying one forever


async def test_only_a_schedule_set_with_wake_asks_to_wake_its_session(
    store: SQLiteJournalStore,
) -> None:
    waking = SchedulePayload.setting("tick", every_s=1, content="tock", wake=True)
    plain = SchedulePayload.setting("tick", every_s=1, content="tock")
    for name in ("waking", "plain", "old"):
        await store.create_session(name)
    await store.append("waking", [NewEntry.of(waking)])
    await store.append("plain", [NewEntry.of(plain)])
    # A journal written before the switch existed: its sets name no ``wake``.
    await store.append("old", [set_entry("tick", 1, "tock")])
    assert "wake" not in NewEntry.of(plain).payload  # what a gateway without it reads
    asked: list[str] = []

    async def wake(session: str) -> bool:
        asked.append(session)
        return True

    clock = await clock_at_set(store, "waking")
    firer = ScheduleFirer(store, clock=clock, wake=wake)
    await firer.load(["waking", "plain", "old"])
    await firer.tick()
    clock.advance(2)
    await firer.tick()

    assert {s: len(await fires(store, s)) for s in ("waking", "plain", "old")} == {
        "waking": 1,
        "plain": 1,
        "old": 1,
    }
    assert asked == ["waking"]


async def test_the_firer_keeps_schedules_not_the_fires_it_folds(
    store: SQLiteJournalStore,
) -> None:
    content = "x" * 10_000
    await store.append("s", [set_entry("big", 1, content)], owner_epoch=1)
    fires_appended = 2_000
    for start in range(1, fires_appended, 500):
        await store.append(
            "s",
            [
                NewEntry(
                    id=f"fire-{n}",
                    kind="schedule",
                    payload={"schedule_id": "big", "op": "fire", "fire_no": n, "content": content},
                )
                for n in range(start, start + 500)
            ],
        )
    book = ScheduleBook("s")
    # Another gateway's view of the journal: nothing of it is already in memory.
    async with SQLiteJournalStore(store.path) as elsewhere:
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            await book.refresh(elsewhere)
            await book.refresh(elsewhere)  # the last page read is let go of
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))

    assert book.schedules["big"].fired == fires_appended
    # 2,000 fires of 10 kB folded: what stays is the schedule, not 20 MB of fires (it
    # was, as the pending inbound of a whole state, and grew with every fire).
    assert kept < 2_000_000, kept


async def test_a_tick_reads_a_bounded_part_of_a_long_journal(store: SQLiteJournalStore) -> None:
    reads: list[str] = []
    read = store.read

    async def counting_read(session: str, after: int = 0, limit: int = 1000) -> Any:
        reads.append(session)
        return await read(session, after, limit)

    store.read = counting_read  # type: ignore[method-assign]
    await store.create_session("long")
    for _ in range(3 * PAGES_PER_TICK):
        await store.append("long", [NewEntry(kind="note", payload={}) for _ in range(PAGE)])
    await store.append("s", [set_entry("tick", 1)], owner_epoch=1)
    clock = await clock_at_set(store, "s")
    clock.advance(1)
    firer = ScheduleFirer(store, clock=clock)
    firer.touch("long")
    firer.touch("s")
    await firer.tick()

    assert reads.count("long") == PAGES_PER_TICK  # the rest waits for the next ticks
    assert [f["fire_no"] for f in await fires(store, "s")] == [1]
    for _ in range(3):
        await firer.tick()
    assert reads.count("long") > 2 * PAGES_PER_TICK  # and it does get read


def test_the_longest_period_still_has_due_times() -> None:

    anchor = datetime.fromisoformat("2026-03-01T00:00:00+00:00")
    longest = schedule("x", MAX_SCHEDULE_PERIOD_S, anchor)
    upcoming = next_fire(longest, anchor)
    assert upcoming is not None and upcoming[1] == anchor + timedelta(days=366)
    assert next_fire(schedule("x", 1e300, anchor), anchor) == (
        1,
        anchor + timedelta(days=366),
    )
    assert next_fire(schedule("x", -1, anchor), anchor) is None
