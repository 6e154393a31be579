"""Group commit: one writer thread, one connection, one fsync for many writes.

Writes queue up while the previous batch commits; the next batch takes all of them
into one transaction. With ``synchronous=FULL`` the commit is the fsync that makes
every write of the batch durable, and only then are the callers' futures resolved.

Write functions follow one rule — *check, then write*: every error they raise on
purpose (a ``ShadowpodError``: a fenced owner, a missing session) is raised before
they change anything, so such a write simply drops out of the batch. Any other error
rolls the whole batch back, and its writes are then retried one per transaction, so
one bad write never takes others down with it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Generic, TypeVar

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.journal import codec

T = TypeVar("T")

MAX_BATCH: Final = 1024
SLOW_COMMIT_S: Final = 0.1
_STOP: Final = object()
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
    __slots__ = ("committed", "error", "fn", "future", "outcome", "session")

    def __init__(self, session: str, fn: WriteFn[T], future: asyncio.Future[T]) -> None:
        self.session = session
        self.fn = fn
        self.future = future
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
    ) -> None:
        self._connect = connect
        self._loop = loop
        self._on_commit = on_commit
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name="shadowpod-sqlite-writer", daemon=True
        )
        self._started = threading.Event()
        self._start_error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    def stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def submit(self, session: str, fn: WriteFn[T]) -> asyncio.Future[T]:
        """Queue ``fn`` for the next batch; the future resolves once it is durable."""
        if not self._thread.is_alive():
            raise RuntimeError("the journal store is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.put(_Write(session, fn, future))
        return future

    def _run(self) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # noqa: BLE001 — handed to start(), which re-raises
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        try:
            stop = False
            while not stop:
                first = self._queue.get()
                if first is _STOP:
                    return
                batch: list[_Write[Any]] = [first]
                while len(batch) < self._max_batch:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stop = True
                        break
                    batch.append(more)
                self._commit(conn, batch)
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, batch: list[_Write[Any]]) -> None:
        started = time.monotonic()
        self._commit_once(conn, batch)
        took = time.monotonic() - started
        if took > SLOW_COMMIT_S:
            logger.warning("slow journal commit: %.0f ms for %d writes", took * 1000, len(batch))

    def _commit_once(self, conn: sqlite3.Connection, batch: list[_Write[Any]]) -> None:
        now_us = time.time_ns() // 1000
        now = codec.from_us(now_us)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for write in batch:
                write.run(conn, now_us, now)
            conn.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 — nothing of the batch happened
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if len(batch) > 1:
                logger.warning(
                    "journal batch of %d writes failed (%s); retrying one by one", len(batch), exc
                )
                for write in batch:
                    write.reset()
                    self._commit(conn, [write])
                return
            logger.error("journal write failed: %s", exc)
            batch[0].reset()
            batch[0].error = exc
        try:
            self._loop.call_soon_threadsafe(self._resolve, batch)
        except RuntimeError:  # the loop is gone: nobody is waiting any more
            logger.warning("journal batch committed after its event loop closed")

    def _resolve(self, batch: list[_Write[Any]]) -> None:
        for write in batch:
            if write.committed:
                self._on_commit(write.session, write.committed)
            if write.future.done():  # the caller gave up waiting; the write stands
                continue
            if write.error is not None:
                write.future.set_exception(write.error)
            else:
                write.future.set_result(write.outcome)
