"""Server-Sent Events: entries go out in the batches they were committed in.

Each event is ``event: entries``, ``id: <last seq>``, ``data: [<entry>, ...]``; a
client that reconnects with ``Last-Event-ID`` (or ``after``) resumes exactly there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import orjson
from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response

from shadowpod.domain.entries import JournalEntry
from shadowpod.gateway.context import Gateway, int_query, parse_int, session_of
from shadowpod.gateway.errors import ApiError

PING_S = 10.0

EntryFilter = Callable[[JournalEntry], bool]


def resume_point(request: web.Request) -> int:
    """Where a stream starts: ``Last-Event-ID`` if the client reconnects, else ``after``."""
    last_event = request.headers.get("Last-Event-ID")
    if last_event is not None and last_event.strip():
        return parse_int(last_event.strip(), "Last-Event-ID")
    return int_query(request, "after", 0)


def encode(entries: Sequence[JournalEntry]) -> str:
    return orjson.dumps([entry.to_json() for entry in entries]).decode()


async def send_entries(sse: EventSourceResponse, entries: Sequence[JournalEntry]) -> None:
    if entries:
        await sse.send(encode(entries), id=str(entries[-1].seq), event="entries")


@asynccontextmanager
async def open_stream(
    gateway: Gateway, request: web.Request, kind: str
) -> AsyncIterator[EventSourceResponse]:
    """An SSE response that ends cleanly when the client leaves or the gateway stops.

    Streams are bounded per session and in all (``max_streams_per_session``,
    ``max_streams``): each holds a socket, a task and the waking and sending of every
    commit of its session (off the append's path: see ``journal/followers.py``), so
    one more is refused (503 ``TooManyStreams``) rather than let any number of them
    load the gateway.
    """
    session = session_of(request)
    counts, config = gateway.event_streams, gateway.config
    if counts[session] >= config.max_streams_per_session:
        raise too_many_streams(f"session {session!r} has {counts[session]} open")
    if counts.total() >= config.max_streams:
        raise too_many_streams(f"this gateway has {counts.total()} open")
    task = asyncio.current_task()
    assert task is not None
    gateway.streams.add(task)
    counts[session] += 1
    gauge = gateway.metrics.streams.labels(kind=kind)
    gauge.inc()
    try:
        async with sse_response(request, ping_interval=PING_S) as sse, _ends_when_gone(sse, task):
            with suppress(ConnectionResetError, asyncio.CancelledError):
                yield sse
    finally:
        gauge.dec()
        counts[session] -= 1
        if counts[session] <= 0:
            del counts[session]
        gateway.streams.discard(task)


@asynccontextmanager
async def _ends_when_gone(sse: EventSourceResponse, task: asyncio.Task[Any]) -> AsyncIterator[None]:
    """Cancel ``task`` (the stream) when the client has left.

    A stream waits for commits, so it would notice a client that left only at the
    session's next commit, holding its place until then; the ping notices within
    ``PING_S`` (its write fails), and the stream ends.
    """
    streaming = True
    left = False

    def leave(_: object) -> None:
        nonlocal left
        if streaming:
            left = True
            task.cancel()

    gone = asyncio.create_task(sse.wait())
    gone.add_done_callback(leave)
    try:
        yield
    finally:
        streaming = False
        gone.remove_done_callback(leave)
        gone.cancel()
        if left:
            task.uncancel()  # the cancellation was ours, and it is over


def too_many_streams(detail: str) -> ApiError:
    return ApiError(
        503,
        "TooManyStreams",
        f"too many event streams: {detail}; close one you no longer read, or retry later "
        "(the limits are the gateway's --max-streams and --max-streams-per-session)",
    )


async def pump(
    sse: EventSourceResponse,
    batches: AsyncIterator[Sequence[JournalEntry]],
    keep: EntryFilter | None = None,
) -> None:
    """Send every batch (filtered by ``keep``) until the client goes away."""
    async for batch in batches:
        await send_entries(sse, batch if keep is None else [e for e in batch if keep(e)])
