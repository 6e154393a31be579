"""The most recent committed entries of each session, in memory.

Readers near the head — an owner taking its next turn, a stream starting from its
cursor, a fence checking what was delivered — are served from here without a thread
hop or a query. Only a store whose commits all pass through this process (SQLite:
one writer process) may use it; an entry is added only once durable, and a gap
(anything not contiguous with what is cached) resets the session's cache.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Final

from shadowpod.domain.entries import JournalEntry

# A busy session appends a few thousand entries a second; an owner a second or two
# behind must still be served from here, or it falls further behind on queries.
PER_SESSION: Final = 4096
SESSIONS: Final = 128


class RecentEntries:
    def __init__(self, per_session: int = PER_SESSION, sessions: int = SESSIONS) -> None:
        self._per_session = per_session
        self._sessions = sessions
        self._cache: OrderedDict[str, deque[JournalEntry]] = OrderedDict()

    def add(self, session: str, entries: Sequence[JournalEntry]) -> None:
        if not entries:
            return
        cached = self._cache.get(session)
        if cached is None or (cached and cached[-1].seq + 1 != entries[0].seq):
            cached = deque(maxlen=self._per_session)
            self._cache[session] = cached
            if len(self._cache) > self._sessions:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(session)
        cached.extend(entries)

    def read(self, session: str, after: int, limit: int) -> list[JournalEntry] | None:
        """Entries after ``after`` (up to the head: every commit passes through here),
        or ``None`` when the cache does not reach back that far (ask the database)."""
        cached = self._cache.get(session)
        if not cached or after < cached[0].seq - 1 or after > cached[-1].seq:
            return None
        start = after - cached[0].seq + 1
        return [cached[i] for i in range(start, min(len(cached), start + limit))]

    def head(self, session: str) -> int | None:
        """The seq of the last committed entry, when this cache has seen one."""
        cached = self._cache.get(session)
        return cached[-1].seq if cached else None

    def forget(self, session: str) -> None:
        self._cache.pop(session, None)
