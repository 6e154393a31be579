"""Session leases on PostgreSQL (``journal/leases.py``): one row per session, the
database's clock deciding expiry, one statement per operation."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from shadowpod.domain.entries import check_session_id
from shadowpod.journal.errors import LeaseLost
from shadowpod.journal.leases import Lease

Conn = AsyncConnection[TupleRow]
Connect = Callable[[], AbstractAsyncContextManager[Conn]]

_COLUMNS = "session, holder, url, generation, expires"


def ddl(s: str) -> str:
    return f"""CREATE TABLE IF NOT EXISTS {s}.leases (
        session text PRIMARY KEY,
        holder text NOT NULL,
        url text NOT NULL,
        generation bigint NOT NULL,
        expires timestamptz NOT NULL)"""


def _lease(row: TupleRow) -> Lease:
    return Lease(session=row[0], holder=row[1], url=row[2], generation=row[3], expires=row[4])


def _check_ttl(ttl_s: float) -> float:
    if not 0 < ttl_s <= 3600:
        raise ValueError(f"a lease lasts more than 0 and at most 3600 seconds, not {ttl_s}")
    return ttl_s


class PostgresLeases:
    def __init__(self, schema: str, connect: Connect) -> None:
        self.s = schema
        self._connect = connect
        self.guard: str | None = None

    async def check_held(self, conn: Conn, session: str) -> None:
        """In the caller's transaction: ``LeaseLost`` unless ``guard`` holds the
        session's live lease, which then cannot be taken over before the transaction
        ends (the row is share-locked)."""
        if self.guard is None:
            return
        row = await (
            await conn.execute(
                f"SELECT 1 FROM {self.s}.leases WHERE session = %s AND holder = %s "
                "AND expires > clock_timestamp() FOR SHARE",
                (session, self.guard),
            )
        ).fetchone()
        if row is None:
            raise LeaseLost(session, self.guard)

    async def claim(self, session: str, replica: str, url: str, ttl_s: float) -> Lease:
        check_session_id(session)
        ttl = _check_ttl(ttl_s)
        async with self._connect() as conn:
            # Taken when free or expired (a new generation), renewed when already ours;
            # a live lease of another replica is left as it is and read back.
            row = await (
                await conn.execute(
                    f"INSERT INTO {self.s}.leases AS l ({_COLUMNS}) VALUES "
                    "(%s, %s, %s, 1, clock_timestamp() + make_interval(secs => %s)) "
                    "ON CONFLICT (session) DO UPDATE SET holder = excluded.holder, "
                    "url = excluded.url, expires = excluded.expires, generation = CASE "
                    "WHEN l.holder = excluded.holder AND l.expires > clock_timestamp() "
                    "THEN l.generation ELSE l.generation + 1 END "
                    "WHERE l.holder = excluded.holder OR l.expires <= clock_timestamp() "
                    f"RETURNING {_COLUMNS}",
                    (session, replica, url, ttl),
                )
            ).fetchone()
            if row is None:
                row = await (
                    await conn.execute(
                        f"SELECT {_COLUMNS} FROM {self.s}.leases WHERE session = %s", (session,)
                    )
                ).fetchone()
        if row is None:  # released between the two statements: try again
            return await self.claim(session, replica, url, ttl_s)
        return _lease(row)

    async def claim_many(
        self, sessions: Iterable[str], replica: str, url: str, ttl_s: float
    ) -> dict[str, int]:
        wanted = sorted({check_session_id(s) for s in sessions})
        ttl = _check_ttl(ttl_s)
        if not wanted:
            return {}
        async with self._connect() as conn:
            # The same rule as ``claim``, row by row; sorted, so two replicas claiming
            # overlapping sets lock rows in one order.
            rows = await (
                await conn.execute(
                    f"INSERT INTO {self.s}.leases AS l ({_COLUMNS}) "
                    "SELECT s, %s, %s, 1, clock_timestamp() + make_interval(secs => %s) "
                    "FROM unnest(%s::text[]) AS s "
                    "ON CONFLICT (session) DO UPDATE SET holder = excluded.holder, "
                    "url = excluded.url, expires = excluded.expires, generation = CASE "
                    "WHEN l.holder = excluded.holder AND l.expires > clock_timestamp() "
                    "THEN l.generation ELSE l.generation + 1 END "
                    "WHERE l.holder = excluded.holder OR l.expires <= clock_timestamp() "
                    "RETURNING session, generation",
                    (replica, url, ttl, wanted),
                )
            ).fetchall()
        return {row[0]: row[1] for row in rows}

    async def renew(self, replica: str, ttl_s: float) -> set[str]:
        ttl = _check_ttl(ttl_s)
        async with self._connect() as conn:
            rows = await (
                await conn.execute(
                    f"UPDATE {self.s}.leases SET expires = clock_timestamp() + "
                    "make_interval(secs => %s) WHERE holder = %s AND expires > clock_timestamp() "
                    "RETURNING session",
                    (ttl, replica),
                )
            ).fetchall()
        return {row[0] for row in rows}

    async def release(self, replica: str, sessions: Iterable[str] | None = None) -> int:
        async with self._connect() as conn:
            if sessions is None:
                cursor = await conn.execute(
                    f"DELETE FROM {self.s}.leases WHERE holder = %s", (replica,)
                )
            else:
                cursor = await conn.execute(
                    f"DELETE FROM {self.s}.leases WHERE holder = %s AND session = ANY(%s)",
                    (replica, list(sessions)),
                )
            return cursor.rowcount

    async def holder(self, session: str) -> Lease | None:
        async with self._connect() as conn:
            row = await (
                await conn.execute(
                    f"SELECT {_COLUMNS} FROM {self.s}.leases "
                    "WHERE session = %s AND expires > clock_timestamp()",
                    (session,),
                )
            ).fetchone()
        return None if row is None else _lease(row)
