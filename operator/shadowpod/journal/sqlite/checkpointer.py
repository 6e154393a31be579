"""WAL checkpoints off the write path.

SQLite's automatic checkpoint runs inside the commit that crosses the threshold, so
one unlucky batch of appends waits for pages to be copied into the database file and
fsynced. Here a separate thread checkpoints in ``PASSIVE`` mode (it never blocks the
writer or readers) a few times a second; the writer's own auto-checkpoint stays on at
a high threshold only as a backstop.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Final

INTERVAL_S: Final = 1.0
logger = logging.getLogger(__name__)


class Checkpointer:
    def __init__(
        self, connect: Callable[[], sqlite3.Connection], interval_s: float = INTERVAL_S
    ) -> None:
        self._connect = connect
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="shadowpod-sqlite-checkpoint", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while not self._stopping.wait(self._interval_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # the next round tries again
                    logger.warning("WAL checkpoint failed: %s", exc)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.close()
