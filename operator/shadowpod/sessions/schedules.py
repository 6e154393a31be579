"""Schedules belong to the session, not to a process: the gateway fires them.

Each fire is journaled as an inbound ``schedule``/``fire`` entry whose id is derived
from ``(schedule_id, set_seq, fire_no)``, so the journal's idempotency makes every
fire exactly-once — whoever owns the session at that moment, across gateway restarts
(the book is rebuilt from the journal) and across several gateways firing at once.
Fires missed while no gateway ran are coalesced into one (the latest due), the way
cron does not replay a night of missed minutes.

Across gateway replicas (one PostgreSQL journal), only the replica that serves a
session fires its schedules (``FiringRight``: the session's lease): a due fire of a
session nobody serves is taken with its lease, one of a session another replica
serves is left to it, and asked about again ``recheck_s`` later. A replica that comes
to serve a session re-reads its journal before firing (the former holder may have
fired or changed its schedules meanwhile): fires stay exactly once, and a dead
holder's fires resume within its lease time plus ``recheck_s`` and one tick.

One firer serves every session of the gateway, so no session may cost the others
their fires: a period is held to the journal's bounds (a snapshot document is not
checked for them), a tick reads a bounded part of each session's journal, and a
session whose work fails is retried later, with backoff, while the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from shadowpod.domain.bounds import INT64_MAX
from shadowpod.domain.entries import NewEntry, schedule_fire_id
from shadowpod.domain.payloads import (
    MAX_SCHEDULE_PERIOD_S,
    MAX_SCHEDULES_PER_SESSION,
    MIN_SCHEDULE_PERIOD_S,
    EntryKind,
    ScheduleOp,
    SchedulePayload,
)
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import Schedule, SessionState
from shadowpod.journal.codec import load_state_json
from shadowpod.journal.errors import SessionNotFound
from shadowpod.journal.store import JournalStore

logger = logging.getLogger(__name__)
MAX_SLEEP_S: Final = 1.0
# Journal entries a book reads per page, and pages per session per tick: a session with
# a long journal to scan catches up over several ticks instead of holding up the rest.
PAGE: Final = 5_000
PAGES_PER_TICK: Final = 4
# Sessions worked on at once (journal reads, fire appends).
CONCURRENCY: Final = 16
# A session whose work failed is left alone this long, doubling up to the maximum.
RETRY_S: Final = 1.0
MAX_RETRY_S: Final = 60.0
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def schedule_period(schedule: Schedule) -> float | None:
    """The period the firer keeps to: the schedule's own, held to the journal's bounds
    (a snapshot document may carry any number); ``None`` for one that is not a period."""
    every_s = schedule.every_s
    if not math.isfinite(every_s) or every_s <= 0:
        return None
    return min(max(every_s, MIN_SCHEDULE_PERIOD_S), MAX_SCHEDULE_PERIOD_S)


def next_fire(schedule: Schedule, now: datetime) -> tuple[int, datetime] | None:
    """The fire number that is due at ``now`` (coalescing missed ones) and its due time;
    ``None`` when the schedule never fires again (no period, or due past the calendar)."""
    period = schedule_period(schedule)
    if period is None:
        return None
    elapsed = (now - schedule.anchor).total_seconds()
    due_no = max(schedule.fired + 1, math.floor(elapsed / period))
    if due_no > INT64_MAX:
        return None
    try:
        return due_no, schedule.anchor + timedelta(seconds=due_no * period)
    except OverflowError:  # after the year 9999
        return None


class ScheduleBook:
    """The schedules of one session, kept current by scanning its journal forward.

    Only the schedules are kept: the fires the book folds are inbound entries, and
    keeping them (as a full state's ``pending``) grew the firer by every fire's
    content, forever.
    """

    def __init__(self, session: str) -> None:
        self.session = session
        self.scanned_through = 0
        self.loaded = False
        self._schedules: dict[str, Schedule] = {}

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The current schedules (read them, never change them)."""
        return self._schedules

    async def refresh(self, store: JournalStore, max_pages: int | None = None) -> bool:
        """Scan the journal forward; ``True`` once at its head (``max_pages`` bounds the
        pages read in this call)."""
        if not self.loaded:
            snapshot = await store.latest_snapshot(self.session)
            if snapshot is not None:
                state = load_state_json(snapshot.document_json)
                kept = sorted(state.schedules.values(), key=lambda s: s.set_seq)
                self._schedules = {s.schedule_id: s for s in kept[:MAX_SCHEDULES_PER_SESSION]}
                self.scanned_through = state.watermark
            self.loaded = True
        pages = 0
        while max_pages is None or pages < max_pages:
            page = await store.read(self.session, self.scanned_through, PAGE)
            pages += 1
            if not page:
                return True
            scheduling = [e for e in page if e.kind == EntryKind.SCHEDULE]
            if scheduling:
                # The reducer's own rules, on a state of nothing but the schedules.
                folder = StateFolder(
                    SessionState(watermark=self.scanned_through, schedules=self._schedules)
                )
                folder.apply_all(scheduling)
                self._schedules = folder.release().schedules
            self.scanned_through = page[-1].seq
            if len(page) < PAGE:
                return True
        return False


class FiringRight(Protocol):
    """Which sessions this process fires the schedules of (the others' are another's)."""

    async def serving(self, sessions: Collection[str]) -> dict[str, int]:
        """The sessions among ``sessions`` this process serves now, taking those nobody
        serves; each with a number that changes whenever another process served the
        session in between (the lease's generation)."""
        ...


@dataclass
class _Backoff:
    failures: int
    retry_at: float


class ScheduleFirer:
    def __init__(
        self,
        store: JournalStore,
        *,
        clock: Clock = _utcnow,
        on_fire: Callable[[], None] | None = None,
        wake: Callable[[str], Awaitable[object]] | None = None,
        right: FiringRight | None = None,
        recheck_s: float = 2.0,
        rediscover_s: float | None = None,
    ) -> None:
        self._store = store
        # None: this process fires every session's schedules (one gateway).
        self._right = right
        self._recheck_s = recheck_s
        # With several replicas, sessions created through another one are found by
        # listing the journal's sessions this often (one statement).
        self._rediscover_s = rediscover_s
        self._next_discovery = 0.0
        self._parked: dict[str, float] = {}  # served elsewhere: ask again at (monotonic)
        self._served_under: dict[str, int] = {}  # the lease generation last fired under
        self._clock = clock
        self._on_fire = on_fire  # called for every fire this firer journaled
        # Asks a suspended session to wake (the gateway's, as for a client's message).
        self._wake_session = wake
        self._books: dict[str, ScheduleBook] = {}
        self._dirty: set[str] = set()
        self._backoff: dict[str, _Backoff] = {}
        # (session, schedule_id, set_seq) already reported as held to the bounds.
        self._reported: set[tuple[str, str, int]] = set()
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
        self._parked.pop(session, None)
        self._served_under.pop(session, None)
        self._dirty.discard(session)
        self._backoff.pop(session, None)
        self._reported = {r for r in self._reported if r[0] != session}

    def failing(self) -> set[str]:
        """Sessions whose schedule work is failing, and waits for a retry."""
        return set(self._backoff)

    async def discover(self) -> None:
        """Take up the sessions of the journal this firer does not know yet."""
        for info in await self._store.list_sessions():
            if info.session not in self._books:
                self.touch(info.session)

    async def run(self) -> None:
        while True:
            try:
                if self._rediscover_s is not None and time.monotonic() >= self._next_discovery:
                    self._next_discovery = time.monotonic() + self._rediscover_s
                    await self.discover()
                delay = await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug of the firer itself: it must not end firing for good
                logger.exception("schedule firing failed; retrying")
                delay = MAX_SLEEP_S
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def tick(self) -> float:
        """Re-scan the sessions that changed, fire what is due; returns how long until
        the next fire is due (at most ``MAX_SLEEP_S``)."""
        retry = [s for s, b in self._backoff.items() if b.retry_at <= time.monotonic()]
        self._dirty.update(retry)
        dirty, self._dirty = self._dirty, set()
        await self._each(dirty, self._refresh)
        now = self._clock()
        due: dict[str, list[tuple[Schedule, int]]] = {}
        soonest = MAX_SLEEP_S
        for session, book in self._books.items():
            if session in self._dirty or session in self._backoff:
                continue  # not current (a cancel may not be seen yet), or failing
            for schedule in book.schedules.values():
                upcoming = self._next_fire(session, schedule, now)
                if upcoming is None:
                    continue
                fire_no, at = upcoming
                if at <= now:
                    due.setdefault(session, []).append((schedule, fire_no))
                else:
                    soonest = min(soonest, (at - now).total_seconds())
        if due and self._right is not None:
            await self._keep_served(due)
        await self._each(due, lambda session: self._fire(session, due[session]))
        # A session that fired is re-scanned at once, to see its fires and move on.
        return 0.0 if self._dirty else soonest

    async def _keep_served(self, due: dict[str, list[tuple[Schedule, int]]]) -> None:
        """Drop from ``due`` the sessions another process serves, and those this one has
        just come to serve (re-read first: their former server may have fired them)."""
        assert self._right is not None
        mono = time.monotonic()
        asking = [s for s in due if self._parked.get(s, 0.0) <= mono]
        try:
            served = await self._right.serving(asking) if asking else {}
        except Exception as exc:  # noqa: BLE001 — unproven: fire nothing, ask next tick
            logger.warning("cannot tell which sessions this replica serves (%s); no fires", exc)
            due.clear()
            return
        for session in list(due):
            generation = served.get(session)
            if generation is None:
                del due[session]
                if session in asking:
                    self._parked[session] = mono + self._recheck_s
                continue
            self._parked.pop(session, None)
            if self._served_under.get(session) != generation:
                self._served_under[session] = generation
                del due[session]
                self._dirty.add(session)

    async def _each(self, sessions: Iterable[str], work: Callable[[str], Awaitable[None]]) -> None:
        """``work`` for each session, a few at a time; a session whose work fails is
        logged and retried later, with backoff, and takes no other session with it."""
        limit = asyncio.Semaphore(CONCURRENCY)

        async def isolated(session: str) -> None:
            async with limit:
                try:
                    await work(session)
                except SessionNotFound:
                    self.forget(session)
                except Exception as exc:  # noqa: BLE001 — whatever it is, it is this session's
                    self._failed(session, exc)
                else:
                    self._recovered(session)

        await asyncio.gather(*(isolated(session) for session in sessions))

    async def _refresh(self, session: str) -> None:
        book = self._books.setdefault(session, ScheduleBook(session))
        if not await book.refresh(self._store, PAGES_PER_TICK):
            self._dirty.add(session)  # more to read: next tick, after the others

    async def _fire(self, session: str, fires: list[tuple[Schedule, int]]) -> None:
        entries = [
            NewEntry.of(
                SchedulePayload(
                    schedule_id=schedule.schedule_id,
                    op=ScheduleOp.FIRE,
                    fire_no=fire_no,
                    content=schedule.content,
                ),
                id=schedule_fire_id(schedule.schedule_id, schedule.set_seq, fire_no),
            )
            for schedule, fire_no in fires
        ]
        self._dirty.add(session)
        appended = await self._store.append(session, entries)
        fresh = sum(not a.duplicate for a in appended)
        self.fired += fresh
        if self._on_fire is not None:
            for _ in range(fresh):
                self._on_fire()
        # Asked even when the fire was journaled already (by this firer before a
        # failure, or by another replica): the wake is idempotent, and a fire must not
        # be left unable to wake the session it was for.
        if self._wake_session is not None and any(s.wake for s, _ in fires):
            await self._wake_session(session)

    def _next_fire(
        self, session: str, schedule: Schedule, now: datetime
    ) -> tuple[int, datetime] | None:
        if schedule_period(schedule) != schedule.every_s:
            key = (session, schedule.schedule_id, schedule.set_seq)
            if key not in self._reported:
                self._reported.add(key)
                logger.warning(
                    "session %r: schedule %r has a period of %r s, outside %s..%s s; it is "
                    "fired %s",
                    session,
                    schedule.schedule_id,
                    schedule.every_s,
                    MIN_SCHEDULE_PERIOD_S,
                    MAX_SCHEDULE_PERIOD_S,
                    "never" if schedule_period(schedule) is None else "at the nearest bound",
                )
        return next_fire(schedule, now)

    def _failed(self, session: str, exc: Exception) -> None:
        previous = self._backoff.get(session)
        failures = 1 if previous is None else previous.failures + 1
        wait = min(RETRY_S * 2 ** (failures - 1), MAX_RETRY_S)
        self._backoff[session] = _Backoff(failures, time.monotonic() + wait)
        self._dirty.discard(session)
        if previous is None or wait == MAX_RETRY_S:
            logger.warning(
                "session %r: schedule work failed (%s: %s); the other sessions go on, this "
                "one is retried in %.0f s",
                session,
                type(exc).__name__,
                exc,
                wait,
            )

    def _recovered(self, session: str) -> None:
        if self._backoff.pop(session, None) is not None:
            logger.info("session %r: schedule work recovered", session)
