"""Snapshots an owner takes of its state while it serves (no pause of service).

One is due every ``every`` entries, but never more often than the journal has grown
since the last one: a snapshot costs as much as the state is large, so its cost per
entry stays constant, and a restart replays at most half the journal. Each session
adds its own offset (up to a quarter of ``every``, from its name): sessions that
started together and grow alike would otherwise all store a snapshot at the same
moment, for ever after. A ``snapshot-request`` marker in the journal asks for one at
once. At most one is in progress; the state is copied and encoded on the event loop
and stored while the owner goes on serving. A request that arrives while one is in
progress is not dropped: that one holds an older watermark than the requester waits
for, so another follows as soon as it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
from pydantic import BaseModel

from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import SessionState

logger = logging.getLogger(__name__)

StoreSnapshot = Callable[[SessionState, bytes], Awaitable[None]]
_OPTIONS: Final = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z


def periodic_offset(session: str, every: int) -> int:
    """How many entries later than ``every`` this session's periodic snapshots fall due:
    a stable spread over a quarter of ``every`` (0 for small ``every``)."""
    return zlib.crc32(session.encode()) % 1000 * every // 4000


def state_json(state: SessionState) -> bytes:
    """The state document as JSON: what ``state.model_dump_json()`` gives, and loads
    back to an equal state, in about a tenth of the time.

    A long session's state runs to megabytes and an owner stores one while it serves;
    pydantic's serialiser walks the frozen item dataclasses one by one (~50 ms for 20k
    transcript messages here), orjson encodes them natively. The encoder holds the GIL
    either way, so it runs right here rather than on a thread. A value orjson cannot
    encode (an integer beyond 64 bits in an agent's memory) falls back to pydantic.
    """
    try:
        return orjson.dumps(state, default=_model_fields, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return state.model_dump_json().encode()


def state_digest(state: SessionState) -> str:
    """A fingerprint of a state: equal digests, equal states (as stored).

    The state encoded as ``state_json`` does, with every object's keys sorted: a
    promoted owner is asked for it right after a migration, while it serves, and
    pydantic's encoding plus a sorted ``json.dumps`` held its event loop for ~140 ms
    at 30k transcript messages (this takes ~25 ms).
    """
    try:
        canonical = orjson.dumps(
            state, default=_model_fields, option=_OPTIONS | orjson.OPT_SORT_KEYS
        )
    except orjson.JSONEncodeError:  # as in state_json: what orjson cannot encode
        canonical = json.dumps(
            state.model_dump(mode="json"), sort_keys=True, separators=(",", ":")
        ).encode()
    return hashlib.sha256(canonical).hexdigest()


def _model_fields(value: object) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in type(value).model_fields}
    raise TypeError(f"cannot encode {type(value).__name__} in a state document")


class Snapshotter:
    def __init__(self, session: str, every: int, store: StoreSnapshot) -> None:
        self._session = session
        self._every = every
        self._offset = periodic_offset(session, every)
        self._store = store
        self._task: asyncio.Task[int] | None = None
        self._since = 0  # entries applied since the last periodic snapshot
        self._last_at = 0  # the watermark of the last periodic snapshot
        self._requested = False  # a request not yet served by a snapshot started after it

    def applied(self, folder: StateFolder, count: int, *, owner: bool, requested: bool) -> None:
        """``count`` more entries were applied to ``folder``; start a snapshot if one is
        due (only an owner stores snapshots)."""
        self._since += count
        self._requested = owner and (self._requested or requested)
        due = self._every and self._since >= max(self._every, self._last_at) + self._offset
        if owner and (self._requested or due) and (self._task is None or self._task.done()):
            self._start(folder)

    def _start(self, folder: StateFolder) -> None:
        serves_request, self._requested = self._requested, False
        self._since = 0
        self._last_at = folder.watermark
        self._task = asyncio.create_task(self.take(folder))
        self._task.add_done_callback(lambda task: self._done(task, folder, serves_request))

    async def take(self, folder: StateFolder) -> int:
        """Store a snapshot of the folder's current state; returns its watermark."""
        started = time.monotonic()
        view = folder.view()  # a private copy: later entries do not change what is stored
        document = state_json(view)
        await self._store(view, document)
        logger.info(
            "snapshot stored",
            extra={
                "session": self._session,
                "watermark": view.watermark,
                "bytes": len(document),
                "took_ms": round((time.monotonic() - started) * 1000, 1),
            },
        )
        return view.watermark

    async def cancel(self) -> None:
        self._requested = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def _done(self, task: asyncio.Task[int], folder: StateFolder, serves_request: bool) -> None:
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            logger.error("snapshot failed: %s", exc, extra={"session": self._session})
            # A request stays owed; it is tried again with the next entries applied
            # rather than at once, so a gateway that keeps refusing is not hammered.
            self._requested = self._requested or serves_request
        elif self._requested:
            self._start(folder)  # a request came in while this one ran
