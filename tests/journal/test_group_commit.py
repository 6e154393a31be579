"""PostgreSQL's group commit: appends of many sessions share one transaction, and each
keeps its own checks and its own outcome (``journal/postgres/group_commit.py``)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.journal.errors import Fenced, IdempotencyConflict, SessionNotFound
from shadowpod.journal.postgres.ops import PendingAppend
from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.store import Appended, JournalStore, Writer
from tests.conftest import PG_DSN

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def _message(content: str, entry_id: str | None = None) -> NewEntry:
    payload = {"role": "user", "content": content}
    if entry_id is None:
        return NewEntry(kind="message", payload=payload)
    return NewEntry(kind="message", payload=payload, id=entry_id)


async def _transactions(store: JournalStore) -> set[int]:
    """The transactions that wrote the journal's entries (their ``xmin``)."""
    assert isinstance(store, PostgresJournalStore)
    async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
        rows = await (
            await conn.execute(f"SELECT DISTINCT xmin::text FROM {store.schema}.entries")
        ).fetchall()
    return {int(row[0]) for row in rows}


async def test_appends_of_many_sessions_commit_in_one_transaction(store: JournalStore) -> None:
    sessions = [f"s{n}" for n in range(32)]
    for session in sessions:
        await store.create_session(session)
    results = await asyncio.gather(*(store.append(s, [_message(s)]) for s in sessions))
    assert [r[0].seq for r in results] == [1] * len(sessions)
    assert len(await _transactions(store)) == 1
    for session in sessions:  # each durable, in its own session
        [entry] = await store.read(session)
        assert entry.payload["content"] == session


async def test_one_refused_append_leaves_the_others_of_its_group_journaled(
    store: JournalStore,
) -> None:
    for session in ("fenced", "conflict", "fine", "repeat"):
        await store.create_session(session)
    await store.compare_and_set_ownership("fenced", 0, Ownership(epoch=1, owner="old"))
    await store.compare_and_set_ownership("fenced", 1, Ownership(epoch=2, owner="new"))
    first = await store.append("conflict", [_message("original", "k")], writer=Writer.CLIENT)
    kept = await store.append("repeat", [_message("same", "r")], writer=Writer.CLIENT)
    before = await _transactions(store)

    outcomes = await asyncio.gather(
        store.append("fenced", [_message("late")], owner_epoch=1, owner="old"),
        store.append("conflict", [_message("changed", "k")], writer=Writer.CLIENT),
        store.append("missing", [_message("nowhere")]),
        store.append("fine", [_message("a"), _message("b")]),
        store.append("repeat", [_message("same", "r")], writer=Writer.CLIENT),
        store.append("fenced", [_message("current")], owner_epoch=2, owner="new"),
        return_exceptions=True,
    )

    fenced, conflict, missing, fine, repeat, current = outcomes
    assert isinstance(fenced, Fenced) and fenced.current == 2
    assert isinstance(conflict, IdempotencyConflict) and conflict.seq == first[0].seq
    assert isinstance(missing, SessionNotFound)
    assert isinstance(fine, list) and [a.seq for a in fine] == [1, 2]
    assert repeat == [Appended(seq=kept[0].seq, id="r", duplicate=True)]
    assert isinstance(current, list) and not current[0].duplicate
    # The accepted ones were one group: one transaction more.
    assert len(await _transactions(store) - before) == 1
    assert [e.payload["content"] for e in await store.read("conflict")] == ["original"]
    fenced_entries = await store.read("fenced")
    assert "late" not in [e.payload.get("content") for e in fenced_entries]
    assert fenced_entries[-1].payload["content"] == "current" and fenced_entries[-1].epoch == 2


async def test_a_repeated_id_in_one_group_is_journaled_once(store: JournalStore) -> None:
    await store.create_session("s")
    same, again, other = await asyncio.gather(
        store.append("s", [_message("hello", "k")], writer=Writer.CLIENT),
        store.append("s", [_message("hello", "k")], writer=Writer.CLIENT),
        store.append("s", [_message("not hello", "k")], writer=Writer.CLIENT),
        return_exceptions=True,
    )
    assert isinstance(same, list) and isinstance(again, list)
    assert again == [Appended(seq=same[0].seq, id="k", duplicate=True)]
    assert isinstance(other, IdempotencyConflict) and other.seq == same[0].seq
    assert [e.payload["content"] for e in await store.read("s")] == ["hello"]


async def test_a_repeated_id_within_one_append_is_one_entry(store: JournalStore) -> None:
    await store.create_session("s")
    appended = await store.append("s", [_message("x", "k"), _message("y"), _message("x", "k")])
    assert [(a.seq, a.duplicate) for a in appended] == [(1, False), (2, False), (1, True)]
    with pytest.raises(IdempotencyConflict) as refused:
        await store.append("s", [_message("z"), _message("x", "j"), _message("other", "j")])
    assert refused.value.entry_id == "j"
    assert await store.head("s") == 2  # nothing of the refused append


async def test_a_sessions_appends_in_one_group_keep_their_order(store: JournalStore) -> None:
    await store.create_session("s")
    await store.create_session("t")
    results = await asyncio.gather(
        *(store.append(s, [_message(f"{s}{n}")]) for n in range(50) for s in ("s", "t"))
    )
    assert len(await _transactions(store)) == 1
    for session in ("s", "t"):
        entries = await store.read(session)
        assert [e.payload["content"] for e in entries] == [f"{session}{n}" for n in range(50)]
    assert sorted(r[0].seq for r in results) == sorted([*range(1, 51)] * 2)


async def _submit_unchecked(store: JournalStore, session: str, entries: list[NewEntry]) -> object:
    assert isinstance(store, PostgresJournalStore) and store._group is not None
    return await store._group.submit(PendingAppend(session, entries, None, None, Writer.GATEWAY))


async def test_a_group_the_database_rejects_is_retried_one_append_at_a_time(
    store: JournalStore,
) -> None:
    """A NUL character is not something PostgreSQL's jsonb can hold: the whole batch
    statement fails, and the append that carried it must fail alone. (The store's
    ``append`` refuses a NUL before it reaches a batch: submitted here past it, as a
    payload the database refuses for any other reason would be.)"""
    await store.create_session("bad")
    await store.create_session("good")
    bad, good = await asyncio.gather(
        _submit_unchecked(store, "bad", [_message("nul \x00 here")]),
        store.append("good", [_message("fine")]),
        return_exceptions=True,
    )
    assert isinstance(bad, psycopg.Error)
    assert isinstance(good, list) and good[0].seq == 1
    assert await store.head("bad") == 0
    assert [e.payload["content"] for e in await store.read("good")] == ["fine"]


async def test_followers_see_a_groups_entries_once_it_has_committed(store: JournalStore) -> None:
    sessions = [f"s{n}" for n in range(8)]
    for session in sessions:
        await store.create_session(session)

    async def first(session: str) -> str:
        async for entry in store.follow(session):
            return str(entry.payload["content"])
        raise AssertionError("the follower ended")

    followers = [asyncio.create_task(first(s)) for s in sessions]
    await asyncio.sleep(0.05)
    await asyncio.gather(*(store.append(s, [_message(s)]) for s in sessions))
    assert await asyncio.wait_for(asyncio.gather(*followers), 10) == sessions
