"""The owner channel: one WebSocket for an owner's deliveries and appends.

An owner is a long-lived peer that writes on every turn; a WebSocket saves it an
HTTP request per turn, which on a busy session is most of its cost.

Gateway to owner (JSON text frames):

- ``{"op": "entries", "entries": [...], "released": R}`` — the journal after what
  was last sent, pushed as it is committed, with the release watermark (the highest
  inbound seq the owner may process; see ``shadowpod.sessions.gates``);
- ``{"op": "appended", "id": <request id>, "appended": [[seq, id, duplicate], ...],
  "entries": [...], "released": R}`` — the answer to an append carries the journal
  since what was last sent (the owner's own entries included), so a busy owner needs
  one round trip per turn;
- ``{"op": "error", "id": <request id>, "status": 409, "reason": "Fenced", ...}``;
- ``{"op": "superseded", "epoch": E, "current": C}`` — then the channel closes.

Owner to gateway: ``{"op": "append", "id": <request id>, "entries": [...]}``, each
entry validated exactly as on ``POST .../journal``; the epoch is the channel's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

import orjson
from aiohttp import WSMsgType, web
from pydantic import TypeAdapter, ValidationError

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.gateway.context import (
    Gateway,
    gateway,
    int_query,
    required_int_query,
    session_of,
)
from shadowpod.gateway.errors import ApiError, field_errors, status_of
from shadowpod.gateway.routes.owner import deliver, owner_append
from shadowpod.journal.errors import Fenced, OwnerMismatch
from shadowpod.sessions.gates import SessionGate, Superseded

logger = logging.getLogger(__name__)
routes = web.RouteTableDef()
PAGE: Final = 1000
# Validates the list as a whole, so a field path names the entry's index.
ENTRIES: Final = TypeAdapter(list[NewEntry])


class OwnerChannel:
    def __init__(
        self,
        gw: Gateway,
        gate: SessionGate,
        session: str,
        epoch: int,
        ws: web.WebSocketResponse,
        after: int,
        owner: str | None = None,
    ) -> None:
        self.gw = gw
        self.gate = gate
        self.session = session
        self.epoch = epoch
        self.owner = owner
        self.ws = ws
        self.cursor = after
        self.sent_released = -1
        # While an append is being answered, its answer carries the news: the pump
        # leaves it to the answer (one frame, not two) and looks again afterwards.
        self._appending = 0
        self._deferred = False
        # Held while reading what to send and sending it, so the pump and the answers
        # to appends agree on what the owner has been sent.
        self._lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        async with self._lock:
            await self.ws.send_bytes(orjson.dumps(message))

    async def send_news(self, message: dict[str, Any], *, always: bool) -> bool:
        """Send ``message`` with the journal since the cursor and the release watermark;
        unless ``always``, only if there is something new. Returns whether a full page
        went out (there may be more)."""
        async with self._lock:
            page, released = await deliver(
                self.gw, self.gate, self.session, self.epoch, self.cursor, PAGE
            )
            if not (always or page or released != self.sent_released):
                return False
            message["entries"] = [e.to_json() for e in page]
            message["released"] = released
            await self.ws.send_bytes(orjson.dumps(message))
            if page:
                self.cursor = page[-1].seq
            self.sent_released = released
            return len(page) == PAGE

    async def pump(self) -> None:
        """Push every new entry and every move of the release watermark.

        Woken by commits to the session and by changes of the gate (a new epoch is
        recorded in the gate just after its marker commits: an owner replaced on a
        quiet session must still be told at once).
        """
        batches = self.gw.store.follow_batches(self.session, self.cursor)
        # Both waiters live until they fire (creating them per commit cost real CPU).
        next_commit: asyncio.Future[Any] = asyncio.ensure_future(anext(batches))
        gate_changed: asyncio.Future[Any] = asyncio.ensure_future(self.gate.changed())
        try:
            while not self.ws.closed:
                if self._appending:
                    self._deferred = True
                else:
                    while await self.send_news({"op": "entries"}, always=False):
                        pass  # a full page went out: there may be more
                await asyncio.wait({next_commit, gate_changed}, return_when=asyncio.FIRST_COMPLETED)
                if next_commit.done():
                    next_commit.result()  # a failed follow (e.g. a deleted session) ends the pump
                    next_commit = asyncio.ensure_future(anext(batches))
                if gate_changed.done():
                    gate_changed = asyncio.ensure_future(self.gate.changed())
        except Superseded as exc:
            await self.send({"op": "superseded", "epoch": exc.epoch, "current": exc.current})
            await self.ws.close()
        except (ConnectionResetError, RuntimeError, StopAsyncIteration):
            pass  # the owner went away
        finally:
            for waiter in (next_commit, gate_changed):
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await waiter
            await batches.aclose()

    async def handle(self, raw: str | bytes) -> None:
        request_id: Any = None
        try:
            message = orjson.loads(raw)
            request_id = message.get("id") if isinstance(message, dict) else None
            if not isinstance(message, dict) or message.get("op") != "append":
                raise ApiError(
                    400, "InvalidRequest", 'expected {"op": "append", "id": ..., "entries": [...]}'
                )
            raw_entries = message.get("entries")
            if not isinstance(raw_entries, list):
                raise ApiError(400, "InvalidRequest", "entries: must be a list")
            try:
                entries = ENTRIES.validate_python(raw_entries)
            except ValidationError as exc:
                errors = field_errors(exc, "entries.")
                raise ApiError(
                    400,
                    "InvalidRequest",
                    f"invalid entry: {errors[0].loc}: {errors[0].msg}",
                    errors,
                ) from None
            self._appending += 1
            try:
                results = await owner_append(self.gw, self.session, entries, self.epoch, self.owner)
            finally:
                self._appending -= 1
            answer: dict[str, Any] = {
                "op": "appended",
                "id": request_id,
                "appended": [[r.seq, r.id, r.duplicate] for r in results],
            }
            try:
                await self.send_news(answer, always=True)
                if self._deferred and not self._appending:
                    self._deferred = False
                    while await self.send_news({"op": "entries"}, always=False):
                        pass
            except Superseded:  # the appends stand; the pump tells the owner it was replaced
                answer.pop("entries", None)
                answer.pop("released", None)
                await self.send(answer)
        except orjson.JSONDecodeError as exc:
            await self._error(
                request_id, 400, "MalformedJSON", f"the message is not valid JSON: {exc}"
            )
        except ApiError as exc:
            await self._error(
                request_id, exc.status, exc.reason, str(exc), [e.model_dump() for e in exc.errors]
            )
        except ShadowpodError as exc:
            await self._error(request_id, status_of(exc), exc.reason, str(exc))

    async def _error(
        self,
        request_id: Any,
        status: int,
        reason: str,
        message: str,
        errors: list[Any] | None = None,
    ) -> None:
        await self.send(
            {
                "op": "error",
                "id": request_id,
                "status": status,
                "reason": reason,
                "message": message,
                "errors": errors or [],
            }
        )


@routes.get("/v1/sessions/{session}/owner/channel", name="owner_channel")
async def owner_channel(request: web.Request) -> web.StreamResponse:
    gw = gateway(request)
    session = session_of(request)
    owner = await gw.auth.owner(request, session)
    epoch = required_int_query(request, "epoch", minimum=1)
    after = int_query(request, "after", 0)
    current = await gw.store.get_ownership(session)
    if current.epoch != epoch:
        raise Fenced(session, epoch=epoch, current=current.epoch)
    if owner is not None and current.owner != owner:
        raise OwnerMismatch(session, epoch=epoch, owner=owner, current_owner=current.owner)
    gate = await gw.gates.get(session)
    # No per-message compression: frames are small JSON, and deflating each one cost
    # the gateway a tenth of its CPU under load.
    ws = web.WebSocketResponse(
        heartbeat=20.0, max_msg_size=gw.config.max_body_bytes, compress=False
    )
    await ws.prepare(request)
    channel = OwnerChannel(gw, gate, session, epoch, ws, after, owner)
    task = asyncio.current_task()
    assert task is not None
    gw.streams.add(task)
    gw.owner_channels.setdefault(session, set()).add(task)
    gauge = gw.metrics.streams.labels(kind="owner")
    gauge.inc()
    pump = asyncio.create_task(channel.pump())
    try:
        async for message in ws:
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await channel.handle(message.data)
            elif message.type == WSMsgType.ERROR:
                break
    except asyncio.CancelledError:
        pass
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump
        gauge.dec()
        gw.streams.discard(task)
        if (open_channels := gw.owner_channels.get(session)) is not None:
            open_channels.discard(task)
            if not open_channels:
                gw.owner_channels.pop(session, None)
        await ws.close()
    return ws
