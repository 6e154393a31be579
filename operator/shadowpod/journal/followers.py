"""Low-latency tailing of a session's journal.

A committed batch is handed straight to the followers in the same process (no
database round trip on the hot path). Followers fall back to reading the database
when they missed something (a gap, an overflowing queue) or when a commit happened in
another process (PostgreSQL ``NOTIFY``, or the poll interval for SQLite readers).
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Final

from shadowpod.domain.entries import JournalEntry

# A follower this far behind stops buffering and re-reads from the database instead.
MAX_BUFFERED_BATCHES: Final = 1024
# How many entries a follower reads from the database at once when it has to.
FOLLOW_BATCH: Final = 1000

ReadFn = Callable[[int, int], Awaitable[list[JournalEntry]]]
SessionReadFn = Callable[[str, int, int], Awaitable[list[JournalEntry]]]


class Subscription:
    __slots__ = ("_batches", "_event", "_overflowed")

    def __init__(self) -> None:
        self._batches: deque[Sequence[JournalEntry]] = deque()
        self._event = asyncio.Event()
        self._overflowed = False

    def push(self, entries: Sequence[JournalEntry]) -> None:
        if len(self._batches) >= MAX_BUFFERED_BATCHES:
            self._batches.clear()
            self._overflowed = True
        elif entries:
            self._batches.append(entries)
        self._event.set()

    def wake(self) -> None:
        """Something was committed that this process did not see: re-read."""
        self._overflowed = True
        self._event.set()

    async def next_batch(self, timeout: float) -> Sequence[JournalEntry] | None:
        """The next pushed batch, or ``None`` when the caller should re-read the store."""
        while True:
            if self._overflowed:
                self._overflowed = False
                self._batches.clear()
                return None
            if self._batches:
                return self._batches.popleft()
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return None


class FollowerHub:
    """Per-session fan-out of committed entries to in-process followers."""

    def __init__(self) -> None:
        self._subscriptions: dict[str, set[Subscription]] = {}

    def subscribe(self, session: str) -> Subscription:
        subscription = Subscription()
        self._subscriptions.setdefault(session, set()).add(subscription)
        return subscription

    def unsubscribe(self, session: str, subscription: Subscription) -> None:
        subscriptions = self._subscriptions.get(session)
        if subscriptions is not None:
            subscriptions.discard(subscription)
            if not subscriptions:
                del self._subscriptions[session]

    def publish(self, session: str, entries: Sequence[JournalEntry]) -> None:
        for subscription in self._subscriptions.get(session, ()):
            subscription.push(entries)

    def wake(self, session: str) -> None:
        for subscription in self._subscriptions.get(session, ()):
            subscription.wake()

    def wake_all(self) -> None:
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                subscription.wake()


async def follow_journal_batches(
    hub: FollowerHub,
    session: str,
    after: int,
    read: ReadFn,
    *,
    batch_limit: int,
    poll_interval: float,
) -> AsyncGenerator[Sequence[JournalEntry], None]:
    """Yield every entry with seq > ``after`` in order, in the batches they come in,
    then keep tailing. Batches are never empty."""
    cursor = after
    # Subscribe before the first read, so nothing committed in between is missed.
    subscription = hub.subscribe(session)
    try:
        while True:
            backlog = await read(cursor, batch_limit)
            if backlog:
                yield backlog
                cursor = backlog[-1].seq
            if len(backlog) == batch_limit:
                continue
            while True:
                batch = await subscription.next_batch(poll_interval)
                if batch is None:
                    break
                if batch[-1].seq <= cursor:
                    continue
                if batch[0].seq > cursor + 1:
                    break  # a gap: something was committed that we were not handed
                fresh = (
                    batch if batch[0].seq == cursor + 1 else [e for e in batch if e.seq > cursor]
                )
                yield fresh
                cursor = fresh[-1].seq
    finally:
        hub.unsubscribe(session, subscription)


async def _one_by_one(
    batches: AsyncGenerator[Sequence[JournalEntry], None],
) -> AsyncIterator[JournalEntry]:
    try:
        async for batch in batches:
            for entry in batch:
                yield entry
    finally:
        await batches.aclose()


class Followers:
    """A store's followers: the hub its commits are published to, and the two ways to
    tail a session (entry by entry, batch by batch) over the store's ``read``."""

    def __init__(self, read: SessionReadFn, *, poll_interval: float) -> None:
        self.hub = FollowerHub()
        self._read = read
        self._poll_interval = poll_interval

    def batches(self, session: str, after: int) -> AsyncGenerator[Sequence[JournalEntry], None]:
        return follow_journal_batches(
            self.hub,
            session,
            after,
            functools.partial(self._read, session),
            batch_limit=FOLLOW_BATCH,
            poll_interval=self._poll_interval,
        )

    def entries(self, session: str, after: int) -> AsyncIterator[JournalEntry]:
        return _one_by_one(self.batches(session, after))
