"""LISTEN/NOTIFY: followers in this process learn of commits made by other processes.

Each commit notifies ``<process token>:<session>``; notifications from this process
are skipped because its own commits reach followers directly through the hub. A lost
connection is re-established with backoff, and every follower is woken after a
reconnect because notifications sent meanwhile are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import psycopg

from shadowpod.journal.followers import FollowerHub

logger = logging.getLogger(__name__)
RECONNECT_BACKOFF_S: Final = (0.1, 0.5, 1.0, 2.0, 5.0)


class NotificationListener:
    def __init__(self, dsn: str, channel: str, token: str, hub: FollowerHub) -> None:
        self._dsn = dsn
        self._channel = channel
        self._token = token
        self._hub = hub
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"listen:{self._channel}")
        await asyncio.wait_for(self._ready.wait(), timeout=30)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True
                ) as conn:
                    await conn.execute(f'LISTEN "{self._channel}"')
                    if failures:
                        self._hub.wake_all()
                    failures = 0
                    self._ready.set()
                    async for notification in conn.notifies():
                        token, _, session = notification.payload.partition(":")
                        if token != self._token:
                            self._hub.wake(session)
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                delay = RECONNECT_BACKOFF_S[min(failures, len(RECONNECT_BACKOFF_S) - 1)]
                failures += 1
                logger.warning(
                    "journal notification listener lost (%s); retrying in %.1fs", exc, delay
                )
                await asyncio.sleep(delay)
