"""Session placement across gateway replicas: one lease per session (DESIGN.md §10).

Several gateway replicas share one PostgreSQL journal, but a session's delivery gate,
fence state and schedules live in one process's memory: each session is served by the
replica holding its lease. A lease is taken when it is free or expired, renewed by its
holder well before it expires, and lost when the holder stops renewing (it died, or
it cannot reach the database): another replica takes it over once it has expired, so
a dead replica's sessions move within ``ttl`` of its last renewal. Expiry is read
from the database's clock, never from the replicas' own.

Each takeover gives the lease a new ``generation``: a number that only grows, for a
replica to tell its lease from a later one of the same session. The lease decides
who *serves* a session, not who may write to it: the epoch check in the journal
stays the last word on writes.

Only PostgreSQL has leases: SQLite is one gateway process, which holds every session.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Lease:
    session: str
    holder: str  # the replica's id
    url: str  # where the holder serves (requests reaching another replica go there)
    generation: int
    expires: datetime

    def held_by(self, replica: str) -> bool:
        return self.holder == replica


class SessionLeases(Protocol):
    guard: str | None
    """Set to a replica: from then on every ownership change the store makes checks, in
    its own transaction, that this replica holds the session's live lease
    (``LeaseLost`` otherwise). A replica that lost a session mid-fence cannot bump its
    epoch."""

    async def claim(self, session: str, replica: str, url: str, ttl_s: float) -> Lease:
        """The session's lease after taking it for ``replica`` if it is free, expired
        or already ``replica``'s (then renewed): otherwise the live holder's, as it
        stands. A session that does not exist gets a lease all the same (the request
        that names it is answered 404 by whoever serves it)."""
        ...

    async def claim_many(
        self, sessions: Iterable[str], replica: str, url: str, ttl_s: float
    ) -> dict[str, int]:
        """``claim`` for many sessions in one statement: those ``replica`` holds after it
        (free, expired or already its own), with their lease's generation; the others
        are left to their live holders."""
        ...

    async def renew(self, replica: str, ttl_s: float) -> set[str]:
        """Extend every unexpired lease ``replica`` holds; the sessions it still holds
        (an expired one may have been taken over: it is not renewed)."""
        ...

    async def release(self, replica: str, sessions: Iterable[str] | None = None) -> int:
        """Give up ``replica``'s leases (of ``sessions``, or all): another replica may
        take them at once. How many were released."""
        ...

    async def holder(self, session: str) -> Lease | None:
        """The session's live lease, ``None`` when nobody holds it."""
        ...
