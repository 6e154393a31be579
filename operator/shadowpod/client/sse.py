"""Reading Server-Sent Events (https://html.spec.whatwg.org/#server-sent-events).

Lines are split here from raw chunks: one ``data:`` line carries a whole batch of
entries and may be far longer than aiohttp's ``readline`` allows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    data: str
    id: str | None


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    pending = b""
    async for chunk in content.iter_any():
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line
    if pending:
        yield pending


async def iter_sse(content: aiohttp.StreamReader) -> AsyncIterator[SseEvent]:
    """Events from a ``text/event-stream`` body; comments (pings) are skipped."""
    event = "message"
    data: list[str] = []
    last_id: str | None = None
    async for raw in _lines(content):
        line = raw.decode().rstrip("\r")
        if not line:
            if data:
                yield SseEvent(event, "\n".join(data), last_id)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        elif field == "id":
            last_id = value
