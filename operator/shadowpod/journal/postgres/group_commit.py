"""Group commit on PostgreSQL: the appends of many sessions in one transaction.

One append per round trip and per commit left PostgreSQL at a sixth of SQLite's
durable appends/s: each append paid a network round trip, a transaction and a WAL
flush of its own. Here appends queue while batches are in flight; the next batch takes
every queued append into one statement (``append_batch``), so into one transaction
and one WAL flush, and only once that statement has committed are the callers'
futures resolved: an append is acknowledged after its commit, as before.

Each append of a batch keeps its own checks (epoch, owner, idempotency, turns) and
its own outcome: the SQL function runs it in a block of its own, so one refused append
drops out and the others are journaled. A batch that fails as a whole (the connection
dropped, an error no append raises on purpose) is retried one append per transaction,
so one bad append never takes the others down with it. Appends are ordered by session
within a batch (stably: a session's appends keep their order) so that batches running
at once take session row locks in one order and cannot deadlock each other.

A few batches run at once (``max_in_flight``, each on a pooled connection): while one
waits for its WAL flush, the next is being written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Final

from shadowpod.domain.entries import JournalEntry
from shadowpod.journal.postgres.ops import PendingAppend, append_refusal, appended
from shadowpod.journal.store import Appended

MAX_BATCH: Final = 1024
MAX_IN_FLIGHT: Final = 2
SLOW_BATCH_S: Final = 0.1
logger = logging.getLogger(__name__)

Outcome = list[tuple[int, bool, datetime | None]] | tuple[str, str | None, str | None]
RunBatch = Callable[[Sequence[PendingAppend]], Awaitable[list[Outcome]]]
RunOne = Callable[[PendingAppend], Awaitable[list[Appended]]]
CommitListener = Callable[[str, list[JournalEntry]], None]


class _Queued:
    __slots__ = ("future", "pending")

    def __init__(self, pending: PendingAppend, future: asyncio.Future[list[Appended]]) -> None:
        self.pending = pending
        self.future = future


class GroupCommit:
    def __init__(
        self,
        run_batch: RunBatch,
        run_one: RunOne,
        on_commit: CommitListener,
        *,
        max_batch: int = MAX_BATCH,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self._run_batch = run_batch
        self._run_one = run_one
        self._on_commit = on_commit
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._queue: deque[_Queued] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self._closed = False

    def submit(self, pending: PendingAppend) -> asyncio.Future[list[Appended]]:
        """Queue ``pending`` for the next batch; the future resolves once it is durable
        (or with the error that refused it)."""
        if self._closed:
            raise RuntimeError("the journal store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Appended]] = loop.create_future()
        self._queue.append(_Queued(pending, future))
        if not self._scheduled and len(self._tasks) < self._max_in_flight:
            # Appends submitted in this turn of the loop join the batch.
            self._scheduled = True
            loop.call_soon(self._launch)
        return future

    async def close(self) -> None:
        """Commit what was submitted, then refuse more."""
        self._closed = True
        while self._tasks or self._queue:
            if self._tasks:
                await asyncio.wait(set(self._tasks))
            else:
                self._launch()

    def _launch(self) -> None:
        self._scheduled = False
        while self._queue and len(self._tasks) < self._max_in_flight:
            count = min(len(self._queue), self._max_batch)
            batch = [self._queue.popleft() for _ in range(count)]
            task = asyncio.create_task(self._commit(batch))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("journal group commit failed", exc_info=task.exception())
        if self._queue and not self._scheduled:
            self._launch()

    async def _commit(self, batch: list[_Queued]) -> None:
        batch.sort(key=lambda queued: queued.pending.session)  # stable: see the docstring
        started = time.monotonic()
        try:
            outcomes = await self._run_batch([queued.pending for queued in batch])
        except Exception as exc:  # noqa: BLE001 — nothing of the batch happened
            logger.warning(
                "journal batch of %d appends failed (%s); retrying one by one", len(batch), exc
            )
            for queued in batch:
                await self._commit_alone(queued)
            return
        took = time.monotonic() - started
        if took > SLOW_BATCH_S:
            logger.warning("slow journal batch: %.0f ms for %d appends", took * 1000, len(batch))
        alone: list[_Queued] = []
        for queued, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, tuple):
                refused = append_refusal(queued.pending, *outcome)
                if refused is None:  # not a refusal of ours: its own transaction says what
                    alone.append(queued)
                else:
                    _settle(queued.future, error=refused)
                continue
            committed: list[JournalEntry] = []
            results = appended(queued.pending, outcome, committed)
            if committed:
                self._hand_on(queued.pending.session, committed)
            _settle(queued.future, results)
        for queued in alone:
            await self._commit_alone(queued)

    async def _commit_alone(self, queued: _Queued) -> None:
        try:
            results = await self._run_one(queued.pending)
        except Exception as exc:  # noqa: BLE001 — this append failed, alone
            _settle(queued.future, error=exc)
        else:
            _settle(queued.future, results)

    def _hand_on(self, session: str, entries: list[JournalEntry]) -> None:
        """The commit listener, for one session: its failure is that session's alone
        (the entries are durable; its followers find the gap and re-read)."""
        try:
            self._on_commit(session, entries)
        except Exception:  # logged; the batch's other appends go on
            logger.exception("handing session %r's committed entries on failed", session)


def _settle(
    future: asyncio.Future[list[Appended]],
    results: list[Appended] | None = None,
    *,
    error: BaseException | None = None,
) -> None:
    if future.done():  # the caller gave up waiting; the append stands (or not) all the same
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(results or [])
