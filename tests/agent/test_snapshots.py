"""An owner's snapshots: a requested one is never dropped, whatever is in progress."""

from __future__ import annotations

import asyncio

from shadowpod.agent.snapshots import Snapshotter
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import SessionState
from tests.domain.builders import JournalBuilder


class Store:
    """Stores snapshots' watermarks. ``hold_first``: the first store waits until
    released (a slow gateway); ``fail_first``: it raises (a gateway gone away)."""

    def __init__(self, *, hold_first: bool = False, fail_first: bool = False) -> None:
        self.stored: list[int] = []
        self.calls = 0
        self.first_started = asyncio.Event()
        self.release_first = asyncio.Event()
        if not hold_first:
            self.release_first.set()
        self._fail_first = fail_first
        self._changed = asyncio.Condition()

    async def __call__(self, view: SessionState, document: bytes) -> None:
        self.calls += 1
        if self.calls == 1:
            self.first_started.set()
            await self.release_first.wait()
            if self._fail_first:
                raise ConnectionError("gateway went away")
        async with self._changed:
            self.stored.append(view.watermark)
            self._changed.notify_all()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(5), self._changed:
            await self._changed.wait_for(lambda: len(self.stored) >= count)


class Owner:
    """A folder fed with inbound messages, reporting to a Snapshotter as the runtime does."""

    def __init__(self, snapshots: Snapshotter, *, owner: bool = True) -> None:
        self.journal = JournalBuilder()
        self.folder = StateFolder(SessionState())
        self.snapshots = snapshots
        self.owner = owner

    def apply(self, count: int, *, requested: bool = False) -> None:
        for n in range(count):
            seq = self.journal.inbound(f"m{n}")
            self.folder.apply(self.journal.entries[seq - 1])
        self.snapshots.applied(self.folder, count, owner=self.owner, requested=requested)


async def _no_more(snapshots: Snapshotter) -> None:
    await asyncio.sleep(0.05)  # room for a further (unwanted) snapshot to show up
    await snapshots.cancel()


async def test_a_request_during_a_periodic_snapshot_gets_a_snapshot_of_its_own() -> None:
    store = Store(hold_first=True)
    snapshots = Snapshotter("s", every=3, store=store)
    owner = Owner(snapshots)

    owner.apply(3)  # a periodic snapshot falls due at seq 3
    await store.first_started.wait()
    # The engine asks for a snapshot at seq 5 or later while that one is stored.
    owner.apply(2, requested=True)
    store.release_first.set()

    await store.wait_for(2)
    await _no_more(snapshots)
    assert store.stored == [3, 5]


async def test_requests_while_one_runs_are_served_by_one_more_snapshot() -> None:
    store = Store(hold_first=True)
    snapshots = Snapshotter("s", every=0, store=store)
    owner = Owner(snapshots)

    owner.apply(1, requested=True)
    await store.first_started.wait()
    for _ in range(3):
        owner.apply(1, requested=True)
    store.release_first.set()

    await store.wait_for(2)
    await _no_more(snapshots)
    assert store.stored == [1, 4]


async def test_a_failed_requested_snapshot_is_taken_again_with_the_next_entries() -> None:
    store = Store(fail_first=True)
    snapshots = Snapshotter("s", every=0, store=store)
    owner = Owner(snapshots)

    owner.apply(1, requested=True)
    await store.first_started.wait()
    await asyncio.sleep(0.05)
    assert store.stored == []

    owner.apply(1)
    await store.wait_for(1)
    await _no_more(snapshots)
    assert store.stored == [2]


async def test_a_shadow_takes_no_snapshot_even_when_asked() -> None:
    store = Store()
    snapshots = Snapshotter("s", every=1, store=store)
    Owner(snapshots, owner=False).apply(2, requested=True)
    await _no_more(snapshots)
    assert store.calls == 0
