"""Suspend, wake and resume: a session with no pod, whose journal keeps buffering.

- **Suspend** is an ExchangeFence to an owner that is not started: the current owner
  finishes its turn, the epoch moves on (so it can write nothing more), and the new
  epoch's record says ``suspended``: nothing is delivered, clients' messages keep
  being journaled. A ``control``/``suspend`` marker says so in the journal.
- **Wake**: a client's message to a suspended session (or a fire of a schedule set
  with ``wake``) turns the record to ``waking``
  (one compare-and-set, durable), journals a ``wake`` marker once per suspension, and
  is published on the ``WakeFeed`` the operator long-polls — one connection for every
  session, no polling per session.
- **Resume**: once the new owner runs, the operator opens delivery again; everything
  that waited is released to it, in journal order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.domain.payloads import ControlEvent, ControlPayload
from shadowpod.journal.errors import EpochConflict
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.fence import ExchangeFence, FenceOutcome
from shadowpod.sessions.gates import SessionGates

SUSPENDED_STATES: Final = frozenset({FenceState.SUSPENDED, FenceState.WAKING})
# Wake requests the feed remembers: a reader that falls further behind re-reads
# sessions from its own level-triggered passes.
FEED_SIZE: Final = 10_000


class NotSuspended(ShadowpodError):
    reason = "NotSuspended"

    def __init__(self, session: str, ownership: Ownership) -> None:
        self.ownership = ownership
        super().__init__(
            f"session {session!r} is not suspended (epoch {ownership.epoch}, delivery"
            f" {ownership.fence.value}): only a suspended session resumes"
        )


@dataclass(frozen=True)
class WakeRequest:
    cursor: int
    session: str
    epoch: int
    seq: int
    at: datetime


class WakeFeed:
    """The wake requests of this gateway process, numbered from 1 by ``cursor``."""

    def __init__(self, size: int = FEED_SIZE) -> None:
        self._items: deque[WakeRequest] = deque(maxlen=size)
        self._cursor = 0
        self._changed = asyncio.Event()

    @property
    def cursor(self) -> int:
        return self._cursor

    def publish(self, session: str, epoch: int, seq: int) -> None:
        self._cursor += 1
        self._items.append(WakeRequest(self._cursor, session, epoch, seq, datetime.now(UTC)))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def after(self, cursor: int, wait_s: float) -> list[WakeRequest]:
        """The requests after ``cursor`` (all of them when ``cursor`` is past this
        process's own, as after a gateway restart), waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + wait_s
        while True:
            if cursor > self._cursor:
                cursor = 0
            found = [w for w in self._items if w.cursor > cursor]
            left = deadline - time.monotonic()
            if found or left <= 0:
                return found
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)


def _marker(event: ControlEvent, epoch: int, reason: str, **detail: str | int) -> NewEntry:
    return NewEntry.of(
        ControlPayload(event=event, epoch=epoch, reason=reason, detail=dict(detail)),
        id=f"{event.value}:{epoch}",
    )


class SessionLifecycle:
    def __init__(
        self, store: JournalStore, gates: SessionGates, fence: ExchangeFence, feed: WakeFeed
    ) -> None:
        self._store = store
        self._gates = gates
        self._fence = fence
        self.feed = feed

    async def suspend(
        self, session: str, *, expect_epoch: int, next_owner: str, timeout_s: float, reason: str
    ) -> tuple[FenceOutcome, int]:
        """Fence the owner at ``expect_epoch`` out and hand the session, suspended, to
        ``next_owner`` (started on resume). Returns the fence and the marker's seq."""
        outcome = await self._fence.exchange(
            session,
            expect_epoch=expect_epoch,
            new_owner=next_owner,
            timeout_s=timeout_s,
            then=FenceState.SUSPENDED,
        )
        marker = _marker(ControlEvent.SUSPEND, outcome.epoch, reason, fence_seq=outcome.fence_seq)
        [appended] = await self._store.append(session, [marker])
        return outcome, appended.seq

    async def wake(self, session: str, *, reason: str = "message") -> bool:
        """A client's message (or a waking schedule's fire) came: ask for an owner if
        the session is suspended. Returns whether it is (the message then waits for the
        resume)."""
        ownership = await self._store.get_ownership(session)
        if ownership.fence is FenceState.WAKING:
            return True
        if ownership.fence is not FenceState.SUSPENDED:
            return False
        gate = await self._gates.get(session)
        async with gate.lock:  # one wake per suspension, never amid a resume
            ownership = await self._store.get_ownership(session)
            if ownership.fence is not FenceState.SUSPENDED:
                return ownership.fence is FenceState.WAKING
            waking = await self._store.compare_and_set_ownership(
                session, ownership.epoch, ownership.model_copy(update={"fence": FenceState.WAKING})
            )
        [appended] = await self._store.append(
            session, [_marker(ControlEvent.WAKE, waking.epoch, reason)]
        )
        self.feed.publish(session, waking.epoch, appended.seq)
        return True

    async def resume(self, session: str, *, expect_epoch: int) -> Ownership:
        """The owner the suspension named runs: delivery opens, what waited is released."""
        gate = await self._gates.get(session)
        async with gate.lock:
            current = await self._store.get_ownership(session)
            if current.epoch != expect_epoch:
                raise EpochConflict(session, expected=expect_epoch, current=current)
            if current.fence not in SUSPENDED_STATES:
                raise NotSuspended(session, current)
            opened = await self._store.compare_and_set_ownership(
                session, expect_epoch, current.model_copy(update={"fence": FenceState.OPEN})
            )
            await self._gates.epoch_changed(gate, opened)
        await self._store.append(
            session, [_marker(ControlEvent.RESUME, opened.epoch, "owner-ready")]
        )
        return opened

    async def wait_resumed(self, session: str, wait_s: float) -> bool:
        """Whether the session serves again within ``wait_s`` (re-read from the store
        every second: another gateway replica may be the one that resumes it)."""
        deadline = time.monotonic() + wait_s
        gate = await self._gates.get(session)
        while True:
            if (await self._store.get_ownership(session)).fence not in SUSPENDED_STATES:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await gate.wait_changed(min(left, 1.0))
