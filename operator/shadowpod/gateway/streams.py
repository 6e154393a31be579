"""Server-Sent Events: entries go out in the batches they were committed in.

Each event is ``event: entries``, ``id: <last seq>``, ``data: [<entry>, ...]``; a
client that reconnects with ``Last-Event-ID`` (or ``after``) resumes exactly there.

What a commit costs per stream is kept small, since every stream of a session takes
every commit on the gateway's one event loop: a batch is encoded once for all the
session's streams (``EncodedEvents``), and a stream sends what it has to take in one
write (several commits, when it woke late). A stream that cannot keep up (its client
reads slower than the session commits, or not at all) is not written to again until
its socket has drained: it then resumes from its own cursor (the follower's ring, or
the journal) and gets everything in order, and while it waits it costs a commit
nothing. One that takes nothing for ``SEND_TIMEOUT_S`` is dropped (its connection
aborted); its client resumes with ``Last-Event-ID``.
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
from shadowpod.gateway.context import EncodedEvents, Gateway, int_query, parse_int, session_of
from shadowpod.gateway.errors import ApiError

PING_S = 10.0
# How long a stream's client may take nothing before the stream is dropped (the same
# as aiohttp-sse's own send timeout, which its pings keep).
SEND_TIMEOUT_S = 120.0

EntryFilter = Callable[[JournalEntry], bool]


def resume_point(request: web.Request) -> int:
    """Where a stream starts: ``Last-Event-ID`` if the client reconnects, else ``after``."""
    last_event = request.headers.get("Last-Event-ID")
    if last_event is not None and last_event.strip():
        return parse_int(last_event.strip(), "Last-Event-ID")
    return int_query(request, "after", 0)


def encode_event(entries: Sequence[JournalEntry]) -> bytes:
    """One ``entries`` event, as aiohttp-sse's ``send`` would write it (one data line:
    JSON has no raw line breaks)."""
    data = orjson.dumps([entry.to_json() for entry in entries])
    return b"id: %d\r\nevent: entries\r\ndata: %s\r\n\r\n" % (entries[-1].seq, data)


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


def _events(
    encoded: EncodedEvents,
    session: str,
    run: Sequence[Sequence[JournalEntry]],
    keep: EntryFilter | None,
) -> bytes:
    if keep is not None:  # this stream's own selection: encoded for it alone
        kept = ([entry for entry in batch if keep(entry)] for batch in run)
        return b"".join(encode_event(batch) for batch in kept if batch)
    events = []
    for batch in run:
        event = encoded.get(session, batch)
        if event is None:
            event = encode_event(batch)
            encoded.put(session, batch, event)
        events.append(event)
    return b"".join(events)


async def pump(
    gateway: Gateway,
    request: web.Request,
    sse: EventSourceResponse,
    runs: AsyncIterator[Sequence[Sequence[JournalEntry]]],
    keep: EntryFilter | None = None,
) -> None:
    """Send every run of batches (filtered by ``keep``) until the client goes away;
    after each write, wait until the socket takes it before taking more."""
    session = session_of(request)
    writer = await sse.prepare(request)  # prepared: its body's writer
    assert writer is not None
    async for run in runs:
        events = _events(gateway.encoded_events, session, run, keep)
        if not events:
            continue
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await sse.write(events)
                await writer.drain()
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
            return
