"""Low-latency tailing of a session's journal.

A commit costs the same whatever the number of followers: it appends the batch to its
session's tail (a short ring shared by every follower of the session in this process)
and schedules one notification for after the committing call has returned. Followers
wake on that, take what follows their own cursor from the ring, and read the database
instead when the ring no longer holds it (they fell behind, or stalled), when a commit
happened in another process (PostgreSQL ``NOTIFY``, or found by the poll), or when
something went wrong. The poll is one read per session, not one per follower: every
``poll_interval`` while followers wait, the session's tail asks the database for one
entry after the lowest cursor they wait at, and only when there is one do they all
read again (2,000 idle event streams on a session made 20,000 reads a second). A
follower that stops reading (a client that does not read its socket) holds nothing and
is handed nothing: it costs a commit nothing.

A commit wakes a session's waiting followers in waves of ``WAVE``, one wave per turn of
the event loop: whatever else is ready (the next post, its answer) runs between two
waves instead of after every follower of the session, so how many followers a session
has delays other requests by at most one wave's work per turn.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Final

from shadowpod.domain.entries import JournalEntry

# How many recent commits of a session its tail keeps; a follower further behind reads
# the rest from the database.
TAIL_BATCHES: Final = 256
# How many entries a follower reads from the database at once when it has to.
FOLLOW_BATCH: Final = 1000
# How many waiting followers one turn of the event loop wakes after a commit.
WAVE: Final = 64

ReadFn = Callable[[int, int], Awaitable[list[JournalEntry]]]
SessionReadFn = Callable[[str, int, int], Awaitable[list[JournalEntry]]]


class SessionTail:
    """One session's recent commits and one "changed" signal, shared by its followers.

    Publishing is O(1): the batch joins the ring and at most one notification is
    scheduled (``call_soon``), so the committing call never runs follower code and
    returns before any follower wakes. Followers wait on shared futures, ``WAVE`` to a
    future (no task or timer per follower), released one per turn of the loop; one
    timer per session makes them re-read every ``poll_interval`` while they wait, for
    commits made by other processes.
    """

    __slots__ = (
        "_in_wave",
        "_low",
        "_notifying",
        "_poll",
        "_poll_interval",
        "_probing",
        "_read",
        "_waves",
        "batches",
        "followers",
        "rereads",
    )

    def __init__(self, poll_interval: float, read: ReadFn) -> None:
        self.batches: deque[Sequence[JournalEntry]] = deque(maxlen=TAIL_BATCHES)
        # Bumped whenever followers must read the database rather than trust the ring.
        self.rereads = 0
        self.followers = 0
        self._poll_interval = poll_interval
        # The futures waiting followers wait on, at most WAVE followers each.
        self._waves: list[asyncio.Future[None]] = []
        self._in_wave = 0
        self._notifying = False
        self._poll: asyncio.TimerHandle | None = None
        # The lowest cursor a waiting follower waits at (what the poll asks after).
        self._low: int | None = None
        self._read = read
        self._probing: asyncio.Task[None] | None = None

    def publish(self, entries: Sequence[JournalEntry]) -> None:
        if entries:
            self.batches.append(entries)
        self._announce()

    def reread(self) -> None:
        """Something was committed that this process did not see: re-read."""
        self.rereads += 1
        self._announce()

    def after(self, cursor: int) -> list[Sequence[JournalEntry]] | None:
        """The ring's batches after ``cursor``, in order and without a gap (``[]``: none
        yet); ``None`` when what follows ``cursor`` is not in the ring."""
        batches = self.batches
        if not batches or batches[-1][-1].seq <= cursor:
            return []
        first = len(batches) - 1
        while first > 0 and batches[first - 1][-1].seq > cursor:
            first -= 1
        found: list[Sequence[JournalEntry]] = []
        expected = cursor + 1
        for index in range(first, len(batches)):
            batch = batches[index]
            if batch[0].seq > expected:
                break  # a gap: committed elsewhere, or before the ring's oldest batch
            if batch[0].seq < expected:
                batch = [entry for entry in batch if entry.seq >= expected]
            found.append(batch)
            expected = batch[-1].seq + 1
        return found or None

    async def changed(self, cursor: int) -> None:
        """Until the next publish or re-read: of a follower that has read through
        ``cursor`` (the poll re-reads when the database holds more after it)."""
        self._low = cursor if self._low is None else min(self._low, cursor)
        if not self._waves or self._in_wave >= WAVE:
            loop = asyncio.get_running_loop()
            self._waves.append(loop.create_future())
            self._in_wave = 0
            if self._poll is None and self._probing is None:
                self._poll = loop.call_later(self._poll_interval, self._polled)
        self._in_wave += 1
        # Shielded: a follower cancelled while waiting (its client left) must not
        # cancel the future other followers of the session wait on.
        await asyncio.shield(self._waves[-1])

    def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        if self._probing is not None:
            self._probing.cancel()
            self._probing = None

    def _polled(self) -> None:
        self._poll = None
        if self._waves and self._low is not None:
            self._probing = asyncio.get_running_loop().create_task(self._probe(self._low))

    async def _probe(self, low: int) -> None:
        """One read for the session's waiting followers: more in the database after
        ``low`` (committed by another process) makes them read; else the poll goes on."""
        try:
            found = await self._read(low, 1)
        except Exception:  # noqa: BLE001 — each follower then meets it and says so
            found = None
        self._probing = None
        if found is None or found:
            self.reread()
        elif self._waves and self._poll is None:
            self._poll = asyncio.get_running_loop().call_later(self._poll_interval, self._polled)

    def _announce(self) -> None:
        if not self._waves or self._notifying:
            return
        self._notifying = True
        self._waves[0].get_loop().call_soon(self._notify)

    def _notify(self) -> None:
        self._notifying = False
        waves, self._waves, self._in_wave = self._waves, [], 0
        self._low = None
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        _release(waves, 0)


def _release(waves: list[asyncio.Future[None]], index: int) -> None:
    """Wake ``waves[index]``, and the next wave at the loop's next turn."""
    wave = waves[index]
    if not wave.done():
        wave.set_result(None)
    if index + 1 < len(waves):
        wave.get_loop().call_soon(_release, waves, index + 1)


class FollowerHub:
    """The session tails of one store's followers in this process."""

    def __init__(self, poll_interval: float, read: SessionReadFn) -> None:
        self._poll_interval = poll_interval
        self._read = read
        self._tails: dict[str, SessionTail] = {}

    def subscribe(self, session: str) -> SessionTail:
        tail = self._tails.get(session)
        if tail is None:
            tail = self._tails[session] = SessionTail(
                self._poll_interval, functools.partial(self._read, session)
            )
        tail.followers += 1
        return tail

    def unsubscribe(self, session: str, tail: SessionTail) -> None:
        tail.followers -= 1
        if tail.followers <= 0 and self._tails.get(session) is tail:
            tail.close()
            del self._tails[session]

    def publish(self, session: str, entries: Sequence[JournalEntry]) -> None:
        tail = self._tails.get(session)
        if tail is not None:
            tail.publish(entries)

    def wake(self, session: str) -> None:
        tail = self._tails.get(session)
        if tail is not None:
            tail.reread()

    def wake_all(self) -> None:
        for tail in self._tails.values():
            tail.reread()


async def follow_journal_runs(
    hub: FollowerHub,
    session: str,
    after: int,
    read: ReadFn,
    *,
    batch_limit: int,
) -> AsyncGenerator[list[Sequence[JournalEntry]], None]:
    """Yield every entry with seq > ``after`` in order, in the batches they come in,
    then keep tailing: each time, every batch there is to take (a run; a follower that
    woke late takes several commits at once). Neither runs nor batches are empty."""
    cursor = after
    # Subscribe before the first read, so nothing committed in between is missed.
    tail = hub.subscribe(session)
    try:
        while True:
            rereads = tail.rereads
            backlog = await read(cursor, batch_limit)
            if backlog:
                yield [backlog]
                cursor = backlog[-1].seq
            if len(backlog) == batch_limit:
                continue
            while tail.rereads == rereads:
                fresh = tail.after(cursor)
                if fresh is None:
                    break  # not in the ring: read the database
                if not fresh:
                    await tail.changed(cursor)
                    continue
                yield fresh
                cursor = fresh[-1][-1].seq
    finally:
        hub.unsubscribe(session, tail)


async def _batch_by_batch(
    runs: AsyncGenerator[list[Sequence[JournalEntry]], None],
) -> AsyncGenerator[Sequence[JournalEntry], None]:
    try:
        async for run in runs:
            for batch in run:
                yield batch
    finally:
        await runs.aclose()


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
    """A store's followers: the hub its commits are published to, and the ways to
    tail a session (entry by entry, batch by batch, run by run) over the store's
    ``read``."""

    def __init__(self, read: SessionReadFn, *, poll_interval: float) -> None:
        self.hub = FollowerHub(poll_interval, read)
        self._read = read

    def runs(self, session: str, after: int) -> AsyncGenerator[list[Sequence[JournalEntry]], None]:
        return follow_journal_runs(
            self.hub,
            session,
            after,
            functools.partial(self._read, session),
            batch_limit=FOLLOW_BATCH,
        )

    def batches(self, session: str, after: int) -> AsyncGenerator[Sequence[JournalEntry], None]:
        return _batch_by_batch(self.runs(session, after))

    def entries(self, session: str, after: int) -> AsyncIterator[JournalEntry]:
        return _one_by_one(self.batches(session, after))
