"""Server-Sent Events: entries go out in the batches they were committed in.

Each event is ``event: entries``, ``id: <last seq>``, ``data: [<entry>, ...]``; a
client that reconnects with ``Last-Event-ID`` (or ``after``) resumes exactly there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress

import orjson
from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response

from shadowpod.domain.entries import JournalEntry
from shadowpod.gateway.context import Gateway, int_query, parse_int

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
    """An SSE response that ends cleanly when the client leaves or the gateway stops."""
    task = asyncio.current_task()
    assert task is not None
    gateway.streams.add(task)
    gauge = gateway.metrics.streams.labels(kind=kind)
    gauge.inc()
    try:
        async with sse_response(request, ping_interval=PING_S) as sse:
            with suppress(ConnectionResetError, asyncio.CancelledError):
                yield sse
    finally:
        gauge.dec()
        gateway.streams.discard(task)


async def pump(
    sse: EventSourceResponse,
    batches: AsyncIterator[Sequence[JournalEntry]],
    keep: EntryFilter | None = None,
) -> None:
    """Send every batch (filtered by ``keep``) until the client goes away."""
    async for batch in batches:
        await send_entries(sse, batch if keep is None else [e for e in batch if keep(e)])
