"""A commit costs the same whatever the number of followers of its session: it is
handed to a shared tail, and followers take it from there (or from the database when
they fell behind). Followers that stop reading hold nothing and slow nothing."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Coroutine, Generator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.journal import JournalStore
from shadowpod.journal.followers import TAIL_BATCHES, WAVE
from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from tests.conftest import PG_DSN, drop_pg_schema, postgres_unavailable

FOLLOWERS = 300
COMMITS = 20


def msg(n: int) -> NewEntry:
    return NewEntry(kind="message", payload={"role": "user", "content": f"m{n}"})


@pytest.fixture
async def unpolled(backend: str, tmp_path: Path) -> AsyncIterator[JournalStore]:
    """A store whose followers never poll during the test (the poll is another matter,
    and starts a task on its own)."""
    async with _opened(backend, tmp_path, poll_s=600) as opened:
        yield opened


async def test_a_commit_starts_no_task_per_follower(unpolled: JournalStore) -> None:
    """Waking a follower used to start a task of its own (a wait with a timeout) on every
    commit: ``FOLLOWERS`` x ``COMMITS`` tasks on the gateway's loop. Now none."""
    store = unpolled
    await store.create_session("s")
    seen = [0] * FOLLOWERS
    waiting = asyncio.Event()  # every follower has its backlog and waits for commits

    async def follower(index: int) -> None:
        # Closed here, not by the loop's finaliser (which would start a task for it).
        async with aclosing(store.follow_batches("s")) as batches:
            async for batch in batches:
                seen[index] = batch[-1].seq
                if min(seen) == 1:
                    waiting.set()
                if seen[index] == COMMITS:
                    return

    followers = [asyncio.create_task(follower(i)) for i in range(FOLLOWERS)]
    await store.append("s", [msg(1)])
    await asyncio.wait_for(waiting.wait(), 30)

    loop = asyncio.get_running_loop()
    started = 0

    def counting(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any]
    ) -> asyncio.Task[Any]:
        nonlocal started
        started += 1
        return asyncio.Task(coro, loop=loop)

    loop.set_task_factory(counting)
    try:
        for n in range(2, COMMITS + 1):
            await store.append("s", [msg(n)])
        await asyncio.wait_for(asyncio.gather(*followers), 30)
    finally:
        loop.set_task_factory(None)
    assert seen == [COMMITS] * FOLLOWERS
    # The store's own work may start a few tasks per commit; not one per follower.
    assert started < FOLLOWERS, f"{started} tasks for {COMMITS - 1} commits"


async def test_other_work_runs_between_the_followers_a_commit_wakes(
    unpolled: JournalStore,
) -> None:
    """A commit used to wake every follower of its session in one turn of the loop:
    the next request (its answer, the next post) waited for all of them. Now they wake
    ``WAVE`` at a time, one wave per turn, and whatever else is ready runs between."""
    store = unpolled
    await store.create_session("s")
    await store.append("s", [msg(1)])
    woken: list[int] = []
    waiting = 0
    all_waiting = asyncio.Event()

    async def follower() -> None:
        nonlocal waiting
        async with aclosing(store.follow_batches("s", 1)) as batches:
            waiting += 1
            if waiting == FOLLOWERS:
                all_waiting.set()
            batch = await anext(batches)
            woken.append(batch[-1].seq)

    followers = [asyncio.create_task(follower()) for _ in range(FOLLOWERS)]
    await asyncio.wait_for(all_waiting.wait(), 30)
    for _ in range(5):  # each is now waiting for a commit, not reading its backlog
        await asyncio.sleep(0)
    await store.append("s", [msg(2)])
    # Another request's turns: how many followers had taken the commit at each.
    seen_at_turns = []
    while len(woken) < FOLLOWERS:
        await asyncio.sleep(0)
        seen_at_turns.append(len(woken))
    await asyncio.wait_for(asyncio.gather(*followers), 30)
    assert woken == [2] * FOLLOWERS
    # Each turn, about one wave more had taken it: that turn's wave, and on PostgreSQL
    # a few that its NOTIFY of the commit sent to the database and whose read ended.
    steps = [b - a for a, b in zip([0, *seen_at_turns], seen_at_turns, strict=False)]
    assert max(steps) < 2 * WAVE, steps


async def test_stalled_followers_neither_block_commits_nor_miss_anything(
    store: JournalStore,
) -> None:
    """Followers that take one batch and stop (a client that does not read its socket)
    while many more commits than the tail keeps are made: a live follower gets each in
    order meanwhile, and a stalled one, resumed, gets the rest from the database."""
    await store.create_session("s")
    total = TAIL_BATCHES * 2 + 10
    await store.append("s", [msg(1)])
    stalled = [store.follow_batches("s") for _ in range(50)]
    for follower in stalled:
        assert [e.seq for e in await anext(follower)] == [1]

    live: list[int] = []

    async def follow_live() -> None:
        async for batch in store.follow_batches("s"):
            live.extend(e.seq for e in batch)
            if live[-1] == total:
                return

    reading = asyncio.create_task(follow_live())
    for n in range(2, total + 1):
        await store.append("s", [msg(n)])
    await asyncio.wait_for(reading, 30)
    assert live == list(range(1, total + 1))

    for follower in stalled:
        resumed: list[int] = []
        while not resumed or resumed[-1] < total:
            resumed.extend(e.seq for e in await asyncio.wait_for(anext(follower), 10))
        assert resumed == list(range(2, total + 1))
        await follower.aclose()


class _CountingSQLite(SQLiteJournalStore):
    """Counts the reads its followers make (they read through ``self.read``)."""

    reads = 0

    async def read(self, session: str, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        self.reads += 1
        return await super().read(session, after, limit)


class _CountingPostgres(PostgresJournalStore):
    reads = 0

    async def read(self, session: str, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        self.reads += 1
        return await super().read(session, after, limit)


@contextlib.asynccontextmanager
async def _opened(
    backend: str, tmp_path: Path, *, poll_s: float
) -> AsyncIterator[_CountingSQLite | _CountingPostgres]:
    schema = f"test_{uuid.uuid4().hex[:12]}"
    opened = (
        _CountingSQLite(tmp_path / "journal.db", follow_poll_s=poll_s)
        if backend == "sqlite"
        else _CountingPostgres(PG_DSN, schema=schema, follow_poll_s=poll_s)
    )
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()
        if backend == "postgres":
            drop_pg_schema(schema)


@pytest.fixture
async def counting(
    backend: str, tmp_path: Path
) -> AsyncIterator[_CountingSQLite | _CountingPostgres]:
    async with _opened(backend, tmp_path, poll_s=0.05) as opened:
        yield opened


async def test_idle_followers_cost_one_read_per_poll_not_one_each(
    counting: _CountingSQLite | _CountingPostgres,
) -> None:
    """The poll for commits made by other processes is one read for a session's waiting
    followers: 2,000 idle event streams on a session made the gateway re-read the
    journal 2,000 times a poll (76 % of a core, doing nothing)."""
    store = counting
    await store.create_session("s")
    await store.append("s", [msg(1)])
    ready = asyncio.Event()
    waiting = 0

    async def follower() -> None:
        nonlocal waiting
        async with aclosing(store.follow_batches("s")) as batches:
            async for _ in batches:
                waiting += 1
                if waiting == FOLLOWERS:
                    ready.set()

    followers = [asyncio.create_task(follower()) for _ in range(FOLLOWERS)]
    try:
        await asyncio.wait_for(ready.wait(), 30)
        before = store.reads
        await asyncio.sleep(1.0)  # about 20 polls
        polled = store.reads - before
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
    assert 0 < polled <= 25, f"{polled} reads in 1 s for {FOLLOWERS} idle followers"


async def test_a_lost_notification_is_found_by_the_poll_at_every_cursor() -> None:
    """What the poll is for: a commit made by another replica whose notification never
    came (here: this one's listener stopped) reaches every follower of the session,
    whichever cursor each waits at."""
    if reason := postgres_unavailable():
        pytest.skip(reason)
    schema = f"test_{uuid.uuid4().hex[:12]}"
    here = PostgresJournalStore(PG_DSN, schema=schema, follow_poll_s=0.05)
    elsewhere = PostgresJournalStore(PG_DSN, schema=schema)
    try:
        async with here, elsewhere:
            await here.create_session("s")
            await here.append("s", [msg(n) for n in range(3)])  # seqs 1..3
            assert here._listener is not None
            await here._listener.stop()  # no NOTIFY reaches it from now on
            seen: dict[int, list[int]] = {after: [] for after in range(4)}

            async def follower(after: int) -> None:
                async with aclosing(here.follow_batches("s", after)) as batches:
                    async for batch in batches:
                        seen[after].extend(entry.seq for entry in batch)
                        if seen[after][-1] == 5:
                            return

            followers = [asyncio.create_task(follower(after)) for after in seen]
            await asyncio.sleep(0.3)  # all waiting, the poll going on
            await elsewhere.append("s", [msg(10), msg(11)])  # seqs 4, 5
            await asyncio.wait_for(asyncio.gather(*followers), 10)
    finally:
        drop_pg_schema(schema)
    assert seen == {after: list(range(after + 1, 6)) for after in seen}
