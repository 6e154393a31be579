"""Deleted sessions kept for a while: marked deleted, swept when their time is up.

A session deleted with a keep period (``DELETE /v1/sessions/{s}?keepFor=<seconds>``,
the operator's ``journalRetentionPolicy.retainFor``) is not deleted: its meta records
when it was deleted and when it may go, and its journal, snapshots and history stay
readable with the control token. Its name stays taken: a session created again under
it within the period is this one, restored (``restore``), as with ``Retain``. The
sweeper deletes a marked session once its time is up — but never a parent whose forks
still read its journal: it is kept, marked, until they are gone, then swept.

The mark lives in the session's meta, so both stores keep it as they keep the rest
and a gateway restart forgets nothing. Times come from ``clock`` (tests set it), and
on several gateway replicas only the one holding a session's lease sweeps it
(``right``): two replicas never delete the same session at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from shadowpod.journal.errors import SessionHasForks, SessionNotFound
from shadowpod.journal.store import JournalStore, SessionInfo

DELETED_AT_META: Final = "shadowpod.dev/deleted-at"
DELETE_AFTER_META: Final = "shadowpod.dev/delete-after"
# The longest keep period the gateway takes (ten years, in seconds).
MAX_KEEP_S: Final = 10 * 366 * 86_400
logger = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


class SweepRight(Protocol):
    """Which sessions this process may sweep (on several replicas: their lease holder's)."""

    async def serving(self, sessions: Collection[str]) -> dict[str, int]: ...


@dataclass(frozen=True, slots=True)
class Deletion:
    deleted_at: datetime
    delete_after: datetime


def deletion_of(info: SessionInfo) -> Deletion | None:
    """The session's deletion mark (None: not deleted)."""
    deleted_at = info.meta.get(DELETED_AT_META)
    delete_after = info.meta.get(DELETE_AFTER_META)
    if not deleted_at or not delete_after:
        return None
    return Deletion(datetime.fromisoformat(deleted_at), datetime.fromisoformat(delete_after))


@dataclass(frozen=True, slots=True)
class Swept:
    deleted: list[str] = field(default_factory=list)
    kept_for_forks: list[str] = field(default_factory=list)


class DeletedSessions:
    def __init__(
        self,
        store: JournalStore,
        *,
        clock: Callable[[], datetime] = utc_now,
        right: SweepRight | None = None,
        on_deleted: Callable[[str], None] = lambda _session: None,
    ) -> None:
        self._store = store
        self.clock = clock
        self.right = right
        self.on_deleted = on_deleted

    async def mark(self, session: str, keep_for_s: int) -> Deletion:
        """Mark ``session`` deleted, to be swept ``keep_for_s`` seconds from now (a
        session marked before keeps its first deletion time)."""
        now = self.clock()
        earlier = deletion_of(await self._store.get_session(session))
        deleted_at = now if earlier is None else earlier.deleted_at
        mark = Deletion(deleted_at, now + timedelta(seconds=keep_for_s))
        await self._store.update_meta(
            session,
            {
                DELETED_AT_META: mark.deleted_at.isoformat(),
                DELETE_AFTER_META: mark.delete_after.isoformat(),
            },
        )
        return mark

    async def restore(self, session: str) -> Deletion | None:
        """Take the mark off (the session is in use again); the mark it had."""
        mark = deletion_of(await self._store.get_session(session))
        if mark is not None:
            await self._store.update_meta(session, {DELETED_AT_META: "", DELETE_AFTER_META: ""})
        return mark

    async def marked(self) -> list[tuple[SessionInfo, Deletion]]:
        """Every session marked deleted, with its mark."""
        found = []
        for info in await self._store.list_sessions():
            mark = deletion_of(info)
            if mark is not None:
                found.append((info, mark))
        return found

    async def sweep(self) -> Swept:
        """Delete the marked sessions whose time is up (and this process may sweep)."""
        now = self.clock()
        due = [info.session for info, mark in await self.marked() if mark.delete_after <= now]
        if due and self.right is not None:
            held = await self.right.serving(due)
            due = [s for s in due if s in held]
        swept = Swept()
        for session in due:
            with contextlib.suppress(SessionNotFound):
                await self._delete(session, swept)
        # Again for the parents kept: one whose last fork went in this pass goes too.
        for session in list(swept.kept_for_forks):
            with contextlib.suppress(SessionNotFound, SessionHasForks):
                await self._store.delete_session(session)
                swept.kept_for_forks.remove(session)
                swept.deleted.append(session)
                self.on_deleted(session)
        return swept

    async def _delete(self, session: str, swept: Swept) -> None:
        try:
            await self._store.delete_session(session)
        except SessionHasForks:
            swept.kept_for_forks.append(session)
            return
        swept.deleted.append(session)
        self.on_deleted(session)

    async def run(self, interval_s: float) -> None:
        """Sweep every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                swept = await self.sweep()
            except Exception:
                logger.exception("sweeping the deleted sessions failed")
                continue
            if swept.deleted:
                logger.info("deleted sessions swept", extra={"sessions": swept.deleted})
