"""The embedded journal store: SQLite in WAL mode, one writer process, many readers.

Writes go through the group-commit writer (a batch's SQL on the event loop, its
commit on a thread); reads run on a small pool of reader threads with their own
connections (WAL lets them read while the writer commits). ``follow`` is served from
the in-process follower hub; readers in other processes notice commits by polling.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, TypeVar

from shadowpod.domain.entries import JournalEntry, NewEntry, check_session_id
from shadowpod.domain.ownership import Ownership
from shadowpod.journal import codec
from shadowpod.journal.arguments import (
    check_epoch,
    check_keep,
    check_owner_epoch,
    check_read,
    check_schema_version,
    check_seq,
)
from shadowpod.journal.errors import SnapshotNotFound, StoreFull
from shadowpod.journal.followers import Followers
from shadowpod.journal.recent import RecentEntries
from shadowpod.journal.sqlite import snapshot_sql, sql
from shadowpod.journal.sqlite.checkpointer import Checkpointer
from shadowpod.journal.sqlite.open_failure import open_failure
from shadowpod.journal.sqlite.writer import GroupCommitWriter, WriteTx
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

T = TypeVar("T")

READ_THREADS: Final = 4
# How often a follower re-reads when nothing was committed in this process. Commits in
# this process wake followers at once; this only bounds the delay for other writers.
FOLLOW_POLL_S: Final = 0.1
BUSY_TIMEOUT_MS: Final = 10_000
# The writer's own checkpoint threshold (pages), a backstop for the checkpointer thread.
WRITER_AUTOCHECKPOINT_PAGES: Final = 20_000
# After a checkpoint resets the WAL, its file is cut back to this size.
WAL_SIZE_LIMIT: Final = 64 * 1024 * 1024
CACHE_KIB: Final = 64 * 1024


class SQLiteJournalStore:
    def __init__(
        self,
        path: str | Path,
        *,
        read_threads: int = READ_THREADS,
        follow_poll_s: float = FOLLOW_POLL_S,
    ) -> None:
        if str(path) in ("", ":memory:"):
            raise ValueError(
                "the SQLite journal needs a file path: an in-memory database cannot be "
                "shared by the writer and reader connections"
            )
        self.path = Path(path)
        self._read_threads = read_threads
        self._followers = Followers(self.read, poll_interval=follow_poll_s)
        self._hub = self._followers.hub
        # Every commit passes through this process (one writer), so recent entries can
        # be served from memory.
        self._recent = RecentEntries()
        self._writer: GroupCommitWriter | None = None
        self._checkpointer: Checkpointer | None = None
        self._readers: ThreadPoolExecutor | None = None
        self._reader_local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._reader_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SQLiteJournalStore({str(self.path)!r})"

    # --- lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(self._init_schema)
        except (OSError, sqlite3.Error) as exc:
            raise open_failure(self.path, exc) from exc
        self._writer = GroupCommitWriter(
            self._connect_writer, asyncio.get_running_loop(), self._committed
        )
        self._writer.start()
        self._checkpointer = Checkpointer(self._connect)
        self._checkpointer.start()
        self._readers = ThreadPoolExecutor(
            max_workers=self._read_threads, thread_name_prefix="shadowpod-sqlite-read"
        )

    async def close(self) -> None:
        self._hub.wake_all()
        if self._writer is not None:
            await self._writer.stop()
            self._writer = None
        if self._checkpointer is not None:
            await asyncio.to_thread(self._checkpointer.stop)
            self._checkpointer = None
        if self._readers is not None:
            self._readers.shutdown(wait=True)
            self._readers = None
        with self._reader_lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()

    async def __aenter__(self) -> SQLiteJournalStore:
        await self.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _committed(self, session: str, entries: list[JournalEntry]) -> None:
        try:
            self._recent.add(session, entries)
            self._hub.publish(session, entries)
        except Exception:
            # Neither may now serve what they missed: the cache would answer with a
            # stale head, so it goes; the followers re-read from the database.
            self._recent.forget(session)
            self._hub.wake(session)
            raise

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL in WAL mode syncs the WAL at every commit: an acknowledged append survives
        # a power cut, not only a process crash.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        sql.add_functions(conn)
        return conn

    def _connect_writer(self) -> sqlite3.Connection:
        conn = self._connect()
        conn.execute(f"PRAGMA wal_autocheckpoint={WRITER_AUTOCHECKPOINT_PAGES}")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        return conn

    def _init_schema(self) -> None:
        conn = self._connect()
        try:
            sql.init_schema(conn)
        finally:
            conn.close()

    # --- plumbing ---------------------------------------------------------------------

    async def _write(self, session: str, fn: Callable[[WriteTx], T], *, alone: bool = False) -> T:
        if self._writer is None:
            raise RuntimeError(f"{self!r} is not open")
        try:
            return await self._writer.submit(session, fn, alone=alone)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode == sqlite3.SQLITE_FULL:
                raise StoreFull(exc) from None
            raise

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._readers is None:
            raise RuntimeError(f"{self!r} is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, self._in_read_tx, fn)

    def _in_read_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            self._reader_local.conn = conn
            with self._reader_lock:
                self._reader_conns.append(conn)
        conn.execute("BEGIN")
        try:
            return fn(conn)
        finally:
            conn.execute("COMMIT")

    # --- sessions ---------------------------------------------------------------------

    async def create_session(
        self,
        session: str,
        *,
        meta: Mapping[str, str] | None = None,
        fork: ForkPoint | None = None,
    ) -> SessionInfo:
        check_session_id(session)
        if fork is not None:
            check_seq("fork seq", fork.seq)
        return await self._write(
            session, lambda tx: sql.create_session(tx, session, meta or {}, fork)
        )

    async def update_meta(self, session: str, changes: Mapping[str, str]) -> SessionInfo:
        values = dict(changes)
        return await self._write(session, lambda tx: sql.update_meta(tx, session, values))

    async def get_session(self, session: str) -> SessionInfo:
        return await self._read(lambda conn: sql.get_session(conn, session))

    async def list_sessions(self) -> list[SessionInfo]:
        return await self._read(sql.list_sessions)

    async def positions(self) -> list[SessionPosition]:
        return await self._read(sql.positions)

    async def delete_session(self, session: str) -> None:
        self._recent.forget(session)
        await self._write(session, lambda tx: sql.delete_session(tx, session))
        self._recent.forget(session)
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
        if not entries:
            await self.head(session)  # a missing session is an error even for no entries
            return []
        batch = tuple(entries)
        return await self._write(
            session, lambda tx: sql.append(tx, session, batch, owner_epoch, owner, writer)
        )

    async def read(self, session: str, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        check_read(after, limit)
        recent = self._recent.read(session, after, limit)
        if recent is not None:
            return recent
        return await self._read(lambda conn: sql.read(conn, session, after, limit))

    async def read_json(self, session: str, after: int = 0, limit: int = 1000) -> bytes:
        check_read(after, limit)
        recent = self._recent.read(session, after, limit)
        if recent is not None:
            return codec.entries_json(recent)
        return await self._read(lambda conn: sql.read_json(conn, session, after, limit))

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
        cached = self._recent.head(session)
        if cached is not None:
            return cached
        return await self._read(lambda conn: sql.head(conn, session))

    # --- ownership --------------------------------------------------------------------

    async def get_ownership(self, session: str) -> Ownership:
        return await self._read(lambda conn: sql.get_ownership(conn, session))

    async def compare_and_set_ownership(
        self, session: str, expect_epoch: int, new: Ownership
    ) -> Ownership:
        check_epoch("expect_epoch", expect_epoch)
        check_epoch("epoch", new.epoch)
        return await self._write(
            session, lambda tx: sql.compare_and_set_ownership(tx, session, expect_epoch, new)
        )

    async def acks(self, session: str) -> dict[int, int]:
        return await self._read(lambda conn: sql.acks(conn, session))

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
        if isinstance(document_json, CompressedDocument):
            # Copied from its file on the commit thread: the loop goes on serving.
            compressed = document_json
            return await self._write(
                session,
                lambda tx: snapshot_sql.put_snapshot(
                    tx, session, watermark, schema_version, compressed, owner_epoch, owner
                ),
                alone=True,
            )
        # Compressed on a thread before it is submitted: the batch's SQL runs on the
        # event loop, and a large snapshot would hold up every other session's appends.
        blob = await asyncio.to_thread(codec.compress_document, document_json)
        return await self._write(
            session,
            lambda tx: snapshot_sql.put_snapshot(
                tx, session, watermark, schema_version, blob, owner_epoch, owner
            ),
        )

    async def get_snapshot(self, session: str, watermark: int) -> Snapshot:
        check_seq("watermark", watermark)
        return await self._read(lambda conn: snapshot_sql.get_snapshot(conn, session, watermark))

    async def latest_snapshot(self, session: str) -> Snapshot | None:
        try:
            return await self._read(lambda conn: snapshot_sql.get_snapshot(conn, session, None))
        except SnapshotNotFound:
            return None

    async def list_snapshots(self, session: str) -> list[SnapshotInfo]:
        return await self._read(lambda conn: snapshot_sql.list_snapshots(conn, session))

    async def apply_retention(self, session: str, *, keep_snapshots: int) -> Retention:
        check_keep(keep_snapshots)
        self._recent.forget(session)  # cached entries may fall below the new truncation point
        return await self._write(
            session, lambda tx: snapshot_sql.apply_retention(tx, session, keep_snapshots)
        )
