"""Group commit: one connection, one fsync for many writes.

Writes queue up while the previous batch commits; the next batch takes all of them
into one transaction. With ``synchronous=FULL`` the commit is the fsync that makes
every write of the batch durable, and only then are the callers' futures resolved.

The SQL of a batch runs on the event loop and only its ``COMMIT`` (the fsync) on a
thread. A write thread running the SQL itself gives up the GIL at every statement
and must win it back from a busy event loop each time — under load that waiting,
not SQLite, was most of a commit's time (6-7 ms per batch for ~1 ms of CPU), and
every message waits for two commits. A batch's SQL is about a millisecond of CPU,
which the process pays either way; on the loop it is paid without the hand-offs.

Write functions follow one rule — *check, then write*: every error they raise on
purpose (a ``ShadowpodError``: a fenced owner, a missing session) is raised before
they change anything, so such a write simply drops out of the batch. Any other error
rolls the whole batch back, and its writes are then retried one per transaction, so
one bad write never takes others down with it.

Only this writer writes to the database from this process. Another process holding
the write lock (a tool, a second gateway on the same file) would make the loop wait,
so the loop never waits for the lock: when it is taken, the batch goes to the
thread, which waits there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Generic, TypeVar

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.journal import codec

T = TypeVar("T")

MAX_BATCH: Final = 1024
SLOW_COMMIT_S: Final = 0.1
BUSY_TIMEOUT_S: Final = 10.0
logger = logging.getLogger(__name__)


@dataclass(slots=True)
class WriteTx:
    """What a write function gets: the connection, the batch's clock, and a list in
    which it names the entries it appended (handed to followers once durable)."""

    conn: sqlite3.Connection
    now_us: int
    now: datetime
    committed: list[JournalEntry] = field(default_factory=list)


WriteFn = Callable[[WriteTx], T]
CommitListener = Callable[[str, list[JournalEntry]], None]


class _Write(Generic[T]):
    __slots__ = ("alone", "committed", "error", "fn", "future", "outcome", "session")

    def __init__(
        self, session: str, fn: WriteFn[T], future: asyncio.Future[T], *, alone: bool = False
    ) -> None:
        self.session = session
        self.fn = fn
        self.future = future
        self.alone = alone
        self.committed: list[JournalEntry] = []
        self.outcome: Any = None
        self.error: BaseException | None = None

    def run(self, conn: sqlite3.Connection, now_us: int, now: datetime) -> None:
        tx = WriteTx(conn, now_us, now)
        try:
            self.outcome = self.fn(tx)
        except ShadowpodError as exc:  # raised before writing anything (check, then write)
            self.error = exc
        else:
            self.committed = tx.committed

    def reset(self) -> None:
        self.committed = []
        self.outcome = None
        self.error = None


class GroupCommitWriter:
    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        loop: asyncio.AbstractEventLoop,
        on_commit: CommitListener,
        *,
        max_batch: int = MAX_BATCH,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
    ) -> None:
        self._connect = connect
        self._loop = loop
        self._on_commit = on_commit
        self._max_batch = max_batch
        self._busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._queue: deque[_Write[Any]] = deque()
        self._in_flight = False  # a batch is being written or committed
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="shadowpod-sqlite-commit")

    def start(self) -> None:
        conn = self._connect()
        # The loop must never sleep in SQLite's busy handler (see the module docstring).
        conn.execute("PRAGMA busy_timeout=0")
        self._conn = conn

    async def stop(self) -> None:
        """Commit what was submitted, then close."""
        self._closed = True
        await self._idle.wait()
        self._committer.shutdown(wait=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def submit(self, session: str, fn: WriteFn[T], *, alone: bool = False) -> asyncio.Future[T]:
        """Queue ``fn`` for the next batch; the future resolves once it is durable.

        ``alone``: a long write (a large snapshot copied in from a file) runs in its own
        transaction on the commit thread, never on the event loop, which goes on
        serving meanwhile (other writes wait for the database, not for the loop)."""
        if self._conn is None or self._closed:
            raise RuntimeError("the journal store is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.append(_Write(session, fn, future, alone=alone))
        if not self._in_flight:
            # Writes submitted in this turn of the loop join the batch.
            self._in_flight = True
            self._idle.clear()
            self._loop.call_soon(self._next_batch)
        return future

    def _next_batch(self) -> None:
        if not self._queue:
            self._in_flight = False
            self._idle.set()
            return
        conn = self._conn
        assert conn is not None
        started = time.monotonic()
        if self._queue[0].alone:
            batch = [self._queue.popleft()]
            finishing = self._loop.run_in_executor(self._committer, self._commit_each, batch)
            finishing.add_done_callback(lambda done: self._committed(batch, started, done))
            return
        batch = []
        while self._queue and len(batch) < self._max_batch and not self._queue[0].alone:
            batch.append(self._queue.popleft())
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            # Another process writes (or worse): wait for its lock on the thread, not
            # here; each write then succeeds or fails on its own.
            finishing = self._loop.run_in_executor(self._committer, self._commit_each, batch)
        else:
            finishing = self._loop.run_in_executor(
                self._committer, self._finish, batch, self._write_all(conn, batch)
            )
        finishing.add_done_callback(lambda done: self._committed(batch, started, done))

    def _write_all(self, conn: sqlite3.Connection, batch: list[_Write[Any]]) -> bool:
        """Run the batch's writes in the open transaction; ``False``: one failed (and
        the transaction was rolled back)."""
        now_us = time.time_ns() // 1000
        now = codec.from_us(now_us)
        try:
            for write in batch:
                write.run(conn, now_us, now)
        except Exception as exc:  # noqa: BLE001 — nothing of the batch happened
            _rollback(conn)
            logger.warning(
                "journal batch of %d writes failed (%s); retrying one by one", len(batch), exc
            )
            return False
        return True

    # --- on the commit thread -----------------------------------------------------------

    def _finish(self, batch: list[_Write[Any]], written: bool) -> None:
        conn = self._conn
        assert conn is not None
        if not written:
            self._commit_each(batch)
            return
        try:
            conn.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 — e.g. the disk is full: nothing happened
            _rollback(conn)
            logger.warning(
                "journal commit of %d writes failed (%s); retrying one by one", len(batch), exc
            )
            self._commit_each(batch)

    def _commit_each(self, batch: list[_Write[Any]]) -> None:
        """One transaction per write, waiting for another process's lock if need be."""
        conn = self._conn
        assert conn is not None
        for write in batch:
            write.reset()
            now_us = time.time_ns() // 1000
            try:
                self._begin_waiting(conn)
                write.run(conn, now_us, codec.from_us(now_us))
                conn.execute("COMMIT")
            except Exception as exc:  # noqa: BLE001 — this write failed, alone
                _rollback(conn)
                logger.error("journal write failed: %s", exc)
                write.reset()
                write.error = exc

    def _begin_waiting(self, conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + self._busy_timeout_s
        pause = 0.001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    # --- back on the loop ---------------------------------------------------------------

    def _committed(
        self, batch: list[_Write[Any]], started: float, done: asyncio.Future[None]
    ) -> None:
        took = time.monotonic() - started
        if took > SLOW_COMMIT_S:
            logger.warning("slow journal commit: %.0f ms for %d writes", took * 1000, len(batch))
        failure = done.exception()
        try:
            for write in batch:
                if failure is not None:  # not raised by a write: the thread itself failed
                    write.reset()
                    write.error = failure
                if write.committed:
                    self._hand_on(write.session, write.committed)
                if write.future.done():  # the caller gave up waiting; the write stands
                    continue
                if write.error is not None:
                    write.future.set_exception(write.error)
                else:
                    write.future.set_result(write.outcome)
        finally:
            # Every session's writes go through here: whatever happened above, the
            # next batch is written (it used to wait forever behind one failure).
            self._next_batch()

    def _hand_on(self, session: str, entries: list[JournalEntry]) -> None:
        """The commit listener, for one session: its failure is that session's alone
        (the entries are durable; its followers find the gap and re-read)."""
        try:
            self._on_commit(session, entries)
        except Exception:  # logged; the batch's other writes go on
            logger.exception("handing session %r's committed entries on failed", session)


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):  # the connection is then unusable anyway
            conn.execute("ROLLBACK")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
