"""The production journal store: PostgreSQL, safe with several writer processes.

Driver: psycopg 3 (async). It is fully typed (``mypy --strict`` checks our SQL
plumbing), has first-class ``LISTEN``/``NOTIFY`` (``AsyncConnection.notifies``), a
maintained connection pool, and the same API sync and async; asyncpg is faster on
raw row throughput but ships no type information and its own protocol quirks.

Every write of a session takes that session's row lock (``SELECT ... FOR UPDATE``)
first: two gateway replicas appending to one session queue behind each other, so seqs
stay gap-free, and the epoch check reads the epoch under the same lock as the write.
Appends go through a group commit (``group_commit.py``): the appends of many sessions
share one statement, one transaction and one WAL flush.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Final

import orjson
import psycopg
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool

from shadowpod.domain.entries import JournalEntry, NewEntry, check_session_id
from shadowpod.domain.ownership import Ownership
from shadowpod.journal import codec
from shadowpod.journal.arguments import (
    check_epoch,
    check_keep,
    check_no_nul,
    check_owner_epoch,
    check_read,
    check_schema_version,
    check_seq,
)
from shadowpod.journal.errors import (
    SnapshotNotFound,
    StoreFull,
    StoreUnavailable,
    StoreUnusable,
)
from shadowpod.journal.followers import Followers
from shadowpod.journal.postgres import ops
from shadowpod.journal.postgres.group_commit import GroupCommit, Outcome
from shadowpod.journal.postgres.leases import PostgresLeases
from shadowpod.journal.postgres.listener import NotificationListener
from shadowpod.journal.postgres.schema import check_schema_name, init_schema
from shadowpod.journal.store import (
    Appended,
    CompressedDocument,
    ForkPoint,
    Retention,
    SessionInfo,
    SessionPosition,
    Snapshot,
    SnapshotInfo,
    Writer,
)

POOL_SIZE: Final = 16
# Followers are woken by NOTIFY; the poll only bounds the delay if one is lost.
FOLLOW_POLL_S: Final = 1.0

Conn = AsyncConnection[TupleRow]


async def _configure(conn: Conn) -> None:
    set_json_dumps(orjson.dumps, conn)
    set_json_loads(orjson.loads, conn)
    # psycopg prepares statements it runs often; a generic plan made while a journal
    # was tiny (a sequential scan) would otherwise stick as it grows to millions.
    await conn.execute("SET plan_cache_mode = force_custom_plan")


class PostgresJournalStore:
    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "shadowpod",
        pool_size: int = POOL_SIZE,
        follow_poll_s: float = FOLLOW_POLL_S,
    ) -> None:
        self.dsn = dsn
        self.schema = check_schema_name(schema)
        self._pool_size = pool_size
        self._followers = Followers(self.read, poll_interval=follow_poll_s)
        self._hub = self._followers.hub
        self._token = uuid.uuid4().hex[:12]
        self._channel = f"shadowpod_journal_{self.schema}"
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._listener: NotificationListener | None = None
        self._ops = ops.Statements(self.schema, self._channel, self._token)
        self._group: GroupCommit | None = None
        self.leases = PostgresLeases(self.schema, self._conn)

    def __repr__(self) -> str:
        return f"PostgresJournalStore(schema={self.schema!r})"

    # --- lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        try:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                await init_schema(conn, self.schema)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"cannot reach PostgreSQL for the journal ({exc}); check the DSN and that "
                "the server is up"
            ) from exc
        except psycopg.Error as exc:  # reached, but refused: privileges, a foreign schema
            raise StoreUnusable(
                f"PostgreSQL refused to set up the journal in schema {self.schema!r} ({exc}); "
                "grant this user CREATE on the database, or use another shadowpod_schema"
            ) from exc
        self._pool = AsyncConnectionPool(
            self.dsn,
            min_size=2,
            max_size=self._pool_size,
            kwargs={"autocommit": True},
            configure=_configure,
            open=False,
        )
        await self._pool.open(wait=True)
        self._group = GroupCommit(self._append_batch, self._append_alone, self._hub.publish)
        self._listener = NotificationListener(self.dsn, self._channel, self._token, self._hub)
        await self._listener.start()

    async def close(self) -> None:
        if self._group is not None:
            await self._group.close()
            self._group = None
        self._hub.wake_all()
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> PostgresJournalStore:
        await self.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        if self._pool is None:
            raise RuntimeError(f"{self!r} is not open")
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.errors.DiskFull as exc:  # SQLSTATE 53100
            raise StoreFull(exc) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the journal database is unavailable: {exc}") from exc

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Conn]:
        async with self._conn() as conn, conn.transaction():
            yield conn

    # --- sessions ---------------------------------------------------------------------

    async def create_session(
        self,
        session: str,
        *,
        meta: Mapping[str, str] | None = None,
        fork: ForkPoint | None = None,
    ) -> SessionInfo:
        check_session_id(session)
        check_no_nul("the session's meta", dict(meta or {}))
        if fork is not None:
            check_seq("fork seq", fork.seq)
        async with self._tx() as conn:
            return await self._ops.create_session(conn, session, Jsonb(dict(meta or {})), fork)

    async def update_meta(self, session: str, changes: Mapping[str, str]) -> SessionInfo:
        async with self._tx() as conn:
            return await self._ops.update_meta(conn, session, Jsonb(dict(changes)))

    async def get_session(self, session: str) -> SessionInfo:
        async with self._tx() as conn:
            return await self._ops.get_session(conn, session)

    async def list_sessions(self) -> list[SessionInfo]:
        async with self._tx() as conn:
            return await self._ops.list_sessions(conn)

    async def positions(self) -> list[SessionPosition]:
        async with self._tx() as conn:
            return await self._ops.positions(conn)

    async def delete_session(self, session: str) -> None:
        async with self._tx() as conn:
            await self._ops.delete_session(conn, session)
        self._hub.wake(session)

    # --- journal ----------------------------------------------------------------------

    async def append(
        self,
        session: str,
        entries: Sequence[NewEntry],
        owner_epoch: int | None = None,
        *,
        owner: str | None = None,
        writer: Writer = Writer.GATEWAY,
    ) -> list[Appended]:
        check_owner_epoch(owner_epoch)
        for entry in entries:
            check_no_nul(f"entry {entry.id!r}", entry.payload)
        if self._group is None:
            raise RuntimeError(f"{self!r} is not open")
        scope = Writer.OWNER if owner_epoch is not None else writer
        # Durable once the future resolves: its batch has committed (``group_commit``).
        return await self._group.submit(
            ops.PendingAppend(session, list(entries), owner_epoch, owner, scope)
        )

    async def _append_batch(self, batch: Sequence[ops.PendingAppend]) -> list[Outcome]:
        # One statement, its own transaction (autocommit): see ``append_batch``.
        async with self._conn() as conn:
            return await self._ops.append_batch(conn, batch)

    async def _append_alone(self, pending: ops.PendingAppend) -> list[Appended]:
        committed: list[JournalEntry] = []
        async with self._conn() as conn:
            results = await self._ops.append(
                conn,
                pending.session,
                pending.entries,
                pending.owner_epoch,
                committed,
                owner=pending.owner,
                writer=pending.scope,
            )
        if committed:
            self._hub.publish(pending.session, committed)
        return results

    async def read(self, session: str, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        check_read(after, limit)
        async with self._tx() as conn:
            return await self._ops.read(conn, session, after, limit)

    async def read_json(self, session: str, after: int = 0, limit: int = 1000) -> bytes:
        check_read(after, limit)
        async with self._tx() as conn:
            return await self._ops.read_json(conn, session, after, limit)

    def follow(self, session: str, after: int = 0) -> AsyncIterator[JournalEntry]:
        return self._followers.entries(session, check_seq("after", after))

    def follow_batches(
        self, session: str, after: int = 0
    ) -> AsyncGenerator[Sequence[JournalEntry], None]:
        return self._followers.batches(session, check_seq("after", after))

    def follow_runs(
        self, session: str, after: int = 0
    ) -> AsyncGenerator[list[Sequence[JournalEntry]], None]:
        return self._followers.runs(session, check_seq("after", after))

    async def head(self, session: str) -> int:
        async with self._tx() as conn:
            return (await self._ops.get_session(conn, session)).head

    # --- ownership --------------------------------------------------------------------

    async def get_ownership(self, session: str) -> Ownership:
        async with self._tx() as conn:
            return await self._ops.get_ownership(conn, session)

    async def compare_and_set_ownership(
        self, session: str, expect_epoch: int, new: Ownership
    ) -> Ownership:
        check_epoch("expect_epoch", expect_epoch)
        check_epoch("epoch", new.epoch)
        committed: list[JournalEntry] = []
        async with self._tx() as conn:
            result = await self._ops.compare_and_set_ownership(
                conn, session, expect_epoch, new, committed, self.leases.check_held
            )
        if committed:
            self._hub.publish(session, committed)
        return result

    async def acks(self, session: str) -> dict[int, int]:
        async with self._tx() as conn:
            return await self._ops.acks(conn, session)

    # --- snapshots --------------------------------------------------------------------

    async def put_snapshot(
        self,
        session: str,
        *,
        watermark: int,
        schema_version: int,
        document_json: bytes | CompressedDocument,
        owner_epoch: int | None = None,
        owner: str | None = None,
    ) -> SnapshotInfo:
        check_seq("watermark", watermark)
        check_schema_version(schema_version)
        check_owner_epoch(owner_epoch)
        blob = (
            document_json
            if isinstance(document_json, CompressedDocument)
            else await asyncio.to_thread(codec.compress_document, document_json)
        )
        async with self._tx() as conn:
            return await self._ops.put_snapshot(
                conn, session, watermark, schema_version, blob, owner_epoch, owner
            )

    async def get_snapshot(self, session: str, watermark: int) -> Snapshot:
        check_seq("watermark", watermark)
        async with self._tx() as conn:
            return await self._ops.get_snapshot(conn, session, watermark)

    async def latest_snapshot(self, session: str) -> Snapshot | None:
        try:
            async with self._tx() as conn:
                return await self._ops.get_snapshot(conn, session, None)
        except SnapshotNotFound:
            return None

    async def list_snapshots(self, session: str) -> list[SnapshotInfo]:
        async with self._tx() as conn:
            return await self._ops.list_snapshots(conn, session)

    async def apply_retention(self, session: str, *, keep_snapshots: int) -> Retention:
        check_keep(keep_snapshots)
        async with self._tx() as conn:
            return await self._ops.apply_retention(conn, session, keep_snapshots)
