"""Deleted sessions kept for a period, then swept (``sessions/deletion.py``), on both
stores, with a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from shadowpod.domain.entries import NewEntry
from shadowpod.gateway.placement import Placement
from shadowpod.journal.errors import SessionNotFound
from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.store import ForkPoint, JournalStore
from shadowpod.sessions.deletion import DeletedSessions, deletion_of
from tests.conftest import StoreFactory

DAY = 86_400
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
async def journal(store_factory: StoreFactory) -> AsyncIterator[JournalStore]:
    """A store on either backend (this directory's ``store`` is SQLite only)."""
    opened = store_factory()
    await opened.open()
    yield opened
    await opened.close()


async def _session(store: JournalStore, name: str, messages: int = 3) -> None:
    await store.create_session(name)
    payloads = [{"role": "user", "content": f"m{i}"} for i in range(messages)]
    await store.append(name, [NewEntry(kind="message", payload=p) for p in payloads])


async def test_a_deleted_session_is_kept_readable_for_its_period_then_swept(
    journal: JournalStore,
) -> None:
    clock = Clock()
    deletions = DeletedSessions(journal, clock=clock)
    await _session(journal, "gone")
    await _session(journal, "live")
    mark = await deletions.mark("gone", 7 * DAY)
    assert (mark.deleted_at, mark.delete_after) == (T0, T0 + timedelta(days=7))

    clock.advance(7 * DAY - 1)
    assert (await deletions.sweep()).deleted == []
    # Kept whole: the journal reads as it was, and the listing says what it is.
    assert [e.payload["content"] for e in await journal.read("gone")] == ["m0", "m1", "m2"]
    assert [(info.session, m) for info, m in await deletions.marked()] == [("gone", mark)]

    clock.advance(1)
    assert (await deletions.sweep()).deleted == ["gone"]
    with pytest.raises(SessionNotFound):
        await journal.get_session("gone")
    assert deletion_of(await journal.get_session("live")) is None
    assert (await journal.head("live")) == 3


async def test_a_session_restored_within_its_period_is_never_swept(journal: JournalStore) -> None:
    clock = Clock()
    deletions = DeletedSessions(journal, clock=clock)
    await _session(journal, "back")
    await deletions.mark("back", DAY)
    clock.advance(DAY / 2)
    assert await deletions.restore("back") is not None
    assert await deletions.restore("back") is None  # restoring twice changes nothing
    clock.advance(30 * DAY)
    assert (await deletions.sweep()).deleted == []
    assert (await journal.head("back")) == 3
    # Deleted again later: a new period from then.
    await deletions.mark("back", DAY)
    clock.advance(DAY)
    assert (await deletions.sweep()).deleted == ["back"]


async def test_a_parent_is_kept_for_its_forks_and_swept_with_its_last_one(
    journal: JournalStore,
) -> None:
    clock = Clock()
    deletions = DeletedSessions(journal, clock=clock)
    await _session(journal, "parent")
    await journal.create_session("fork", fork=ForkPoint("parent", 2))
    await deletions.mark("parent", 0)
    swept = await deletions.sweep()
    assert (swept.deleted, swept.kept_for_forks) == ([], ["parent"])
    # The fork still reads its parent's entries as its own.
    assert [e.payload["content"] for e in await journal.read("fork")] == ["m0", "m1"]

    await deletions.mark("fork", DAY)
    clock.advance(DAY)
    swept = await deletions.sweep()  # the fork goes, and the parent kept for it with it
    assert sorted(swept.deleted) == ["fork", "parent"] and swept.kept_for_forks == []
    assert [s.session for s in await journal.list_sessions()] == []


class _Replica:
    """A gateway replica's placement on the shared leases."""

    def __init__(self, store: PostgresJournalStore, name: str) -> None:
        self.placement = Placement(
            store.leases, name, f"http://{name}", ttl_s=30, on_lost=lambda _s: None
        )


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_on_several_replicas_only_the_lease_holder_sweeps_a_session(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    await a.open()
    await b.open()
    try:
        assert isinstance(a, PostgresJournalStore) and isinstance(b, PostgresJournalStore)
        clock = Clock()
        on_a = DeletedSessions(a, clock=clock, right=_Replica(a, "a").placement)
        on_b = DeletedSessions(b, clock=clock, right=_Replica(b, "b").placement)
        for name in ("s1", "s2"):
            await _session(a, name)
            await on_a.mark(name, DAY)
        assert on_a.right is not None
        assert await on_a.right.where("s1") is None  # replica a serves s1 (its lease)
        clock.advance(DAY)
        # b takes the free lease of s2 and sweeps it; s1 is a's.
        assert (await on_b.sweep()).deleted == ["s2"]
        assert deletion_of(await b.get_session("s1")) is not None
        assert (await on_a.sweep()).deleted == ["s1"]
        assert await a.list_sessions() == []
    finally:
        await a.close()
        await b.close()
