"""The owner's side of the owner channel (see ``shadowpod.gateway.routes.channel``).

Deliveries are queued as they arrive; the owner takes them between turns (so the
state a turn sees never changes under it). Appends are sent as frames and answered
by request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from shadowpod.client.gateway import GatewayClient, GatewayError, error_from_body
from shadowpod.domain.entries import JournalEntry, NewEntry, entry_from_json


@dataclass(frozen=True)
class Delivery:
    entries: list[JournalEntry]
    released: int


class ChannelClosed(ConnectionError):
    """The channel ended; ``superseded`` says whether because the owner was replaced."""

    def __init__(self, message: str, *, superseded: bool = False) -> None:
        super().__init__(message)
        self.superseded = superseded


class OwnerChannelClient:
    def __init__(self, client: GatewayClient, session: str, *, epoch: int, after: int) -> None:
        self._client = client
        self._session = session
        self._epoch = epoch
        self._after = after
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[list[list[Any]]]] = {}
        self._ids = itertools.count(1)
        self._deliveries: deque[Delivery] = deque()
        self._arrived = asyncio.Event()
        self._closed: ChannelClosed | None = None

    async def __aenter__(self) -> OwnerChannelClient:
        url = f"{self._client.base_url}/v1/sessions/{self._session}/owner/channel"
        try:
            self._ws = await self._client.http.ws_connect(
                url,
                params={"epoch": self._epoch, "after": self._after},
                heartbeat=20.0,
                max_msg_size=0,
                compress=0,  # small JSON frames on a local network: deflating costs more
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise GatewayError(
                exc.status, "Fenced" if exc.status == 409 else "HandshakeFailed", exc.message
            ) from None
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._ws is not None:
            await self._ws.close()

    def take(self) -> list[Delivery]:
        """Everything delivered since the last call (empty if nothing)."""
        taken = list(self._deliveries)
        self._deliveries.clear()
        self._arrived.clear()
        if not taken and self._closed is not None:
            raise self._closed
        return taken

    async def wait(self, timeout_s: float) -> None:
        """Until something is delivered (or the channel closes, or the timeout)."""
        if self._deliveries or self._closed is not None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), timeout_s)

    async def append(self, entries: Sequence[NewEntry]) -> list[tuple[int, str, bool]]:
        if self._closed is not None:
            raise self._closed
        assert self._ws is not None
        request_id = next(self._ids)
        future: asyncio.Future[list[list[Any]]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        body = {
            "op": "append",
            "id": request_id,
            "entries": [{"id": e.id, "kind": e.kind, "payload": e.payload} for e in entries],
        }
        try:
            try:
                await self._ws.send_bytes(orjson.dumps(body))
            except (aiohttp.ClientError, ConnectionError) as exc:
                # The gateway closed the channel while the frame was still going out (a
                # frame over its limit is refused as soon as its header is read).
                raise ChannelClosed(f"the owner channel broke: {exc}") from exc
            appended = await future
        finally:
            self._pending.pop(request_id, None)
        return [(int(seq), str(entry_id), bool(dup)) for seq, entry_id, dup in appended]

    async def _read(self) -> None:
        assert self._ws is not None
        reason = ChannelClosed("the owner channel closed")
        try:
            async for message in self._ws:
                if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    break
                data = orjson.loads(message.data)
                op = data.get("op")
                if "released" in data:  # "entries", and answers to appends, carry news
                    entries = [entry_from_json(e) for e in data["entries"]]
                    self._deliveries.append(Delivery(entries, int(data["released"])))
                    self._arrived.set()
                if op in ("appended", "error"):
                    future = self._pending.get(data.get("id"))
                    if future is None or future.done():
                        continue
                    if op == "appended":
                        future.set_result(data["appended"])
                    else:
                        future.set_exception(error_from_body(data["status"], data))
                elif op == "superseded":
                    reason = ChannelClosed(
                        f"epoch {data['epoch']} was superseded by epoch {data['current']}",
                        superseded=True,
                    )
        except (aiohttp.ClientError, ConnectionError) as exc:
            reason = ChannelClosed(f"the owner channel broke: {exc}")
        finally:
            self._closed = reason
            self._arrived.set()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(reason)
