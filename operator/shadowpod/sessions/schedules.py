"""Schedules belong to the session, not to a process: the gateway fires them.

Each fire is journaled as an inbound ``schedule``/``fire`` entry whose id is derived
from ``(schedule_id, fire_no)``, so the journal's idempotency makes every fire
exactly-once — whoever owns the session at that moment, across gateway restarts
(the book is rebuilt from the journal) and across several gateways firing at once.
Fires missed while no gateway ran are coalesced into one (the latest due), the way
cron does not replay a night of missed minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Final

from shadowpod.domain.entries import NewEntry, schedule_fire_id
from shadowpod.domain.payloads import EntryKind, ScheduleOp, SchedulePayload
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.schema import load_state_json
from shadowpod.domain.state import Schedule, SessionState
from shadowpod.journal.errors import SessionNotFound
from shadowpod.journal.store import JournalStore

logger = logging.getLogger(__name__)
MAX_SLEEP_S: Final = 1.0
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def next_fire(schedule: Schedule, now: datetime) -> tuple[int, datetime]:
    """The fire number that is due at ``now`` (coalescing missed ones) and its due time."""
    elapsed = (now - schedule.anchor).total_seconds()
    due_no = max(schedule.fired + 1, math.floor(elapsed / schedule.every_s))
    return due_no, schedule.anchor + timedelta(seconds=due_no * schedule.every_s)


class ScheduleBook:
    """The schedules of one session, kept current by scanning its journal forward."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.scanned_through = 0
        self._folder: StateFolder | None = None

    @property
    def schedules(self) -> dict[str, Schedule]:
        return {} if self._folder is None else self._folder.view().schedules

    async def refresh(self, store: JournalStore) -> None:
        if self._folder is None:
            snapshot = await store.latest_snapshot(self.session)
            state = SessionState()
            if snapshot is not None:
                state = load_state_json(
                    snapshot.document_json, schema_version=snapshot.info.schema_version
                )
                state = SessionState(watermark=state.watermark, schedules=state.schedules)
            self._folder = StateFolder(state)
            self.scanned_through = state.watermark
        while True:
            page = await store.read(self.session, self.scanned_through, 5_000)
            if not page:
                return
            # Only schedule entries matter here; the watermark still moves past the rest.
            self._folder.apply_all(e for e in page if e.kind == EntryKind.SCHEDULE)
            self.scanned_through = page[-1].seq


class ScheduleFirer:
    def __init__(
        self,
        store: JournalStore,
        *,
        clock: Clock = _utcnow,
        on_fire: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_fire = on_fire  # called for every fire this firer journaled
        self._books: dict[str, ScheduleBook] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self.fired = 0

    async def load(self, sessions: Iterable[str]) -> None:
        for session in sessions:
            self.touch(session)

    def touch(self, session: str) -> None:
        """Schedule entries were appended to ``session``: re-scan it before the next fire."""
        self._dirty.add(session)
        self._wake.set()

    def forget(self, session: str) -> None:
        self._books.pop(session, None)
        self._dirty.discard(session)

    async def run(self) -> None:
        while True:
            try:
                await self._refresh_dirty()
                delay = await self._fire_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup must not end firing for good
                logger.exception("schedule firing failed; retrying")
                delay = MAX_SLEEP_S
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def _refresh_dirty(self) -> None:
        while self._dirty:
            session = self._dirty.pop()
            book = self._books.setdefault(session, ScheduleBook(session))
            try:
                await book.refresh(self._store)
            except SessionNotFound:
                self._books.pop(session, None)

    async def _fire_due(self) -> float:
        """Fire what is due; return how long until the next fire (capped)."""
        now = self._clock()
        upcoming: list[float] = []
        for session, book in list(self._books.items()):
            for schedule in book.schedules.values():
                fire_no, due = next_fire(schedule, now)
                if due > now:
                    heapq.heappush(upcoming, (due - now).total_seconds())
                    continue
                await self._fire(session, schedule, fire_no)
                self._dirty.add(session)
                heapq.heappush(upcoming, 0.0)
        return min(upcoming[0], MAX_SLEEP_S) if upcoming else MAX_SLEEP_S

    async def _fire(self, session: str, schedule: Schedule, fire_no: int) -> None:
        entry = NewEntry(
            id=schedule_fire_id(schedule.schedule_id, fire_no),
            kind=EntryKind.SCHEDULE,
            payload=SchedulePayload(
                schedule_id=schedule.schedule_id,
                op=ScheduleOp.FIRE,
                fire_no=fire_no,
                content=schedule.content,
            ).model_dump(mode="json", exclude_none=True),
        )
        try:
            [appended] = await self._store.append(session, [entry])
        except SessionNotFound:
            self.forget(session)
            return
        if not appended.duplicate:
            self.fired += 1
            if self._on_fire is not None:
                self._on_fire()
