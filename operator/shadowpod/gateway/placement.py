"""Session placement across gateway replicas: serve the sessions this replica holds the
lease of, forward every other session's requests to its holder.

Forwarded, not redirected: clients, owners, shadows and the operator talk to one
Kubernetes Service and never learn a pod's address (a client outside the cluster
could not reach one), WebSocket owner channels and event streams keep working
unchanged (a client library that follows a 307 for a POST does not for a WebSocket
upgrade), and the cost is one hop inside the cluster for the requests that land on
another replica. A forwarded request carries ``FORWARDED_BY`` and is served where it
lands: a lease that moved meanwhile costs at most one more hop later, never a loop.

A replica serves a session from its own memory while its lease is good: until
``ttl`` after the claim or renewal that proved it, less a margin, by its own clock
(the database's expiry is at least that late). Renewal runs every ``ttl / 3``; a
session whose renewal fails (taken over after this replica could not renew in time)
is dropped from memory at once, its owner channels closed: the owner reconnects
through the Service and lands on the new holder. Takeover bound: a dead replica's
sessions are served again ``ttl`` after its last renewal (default 10 s).

On SIGTERM the replica hands its sessions over before it exits: it stops claiming,
releases every lease (another replica takes each at its next request) and answers
requests for them 503 with ``Retry-After`` until it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Final

import aiohttp
from aiohttp import WSMsgType, web

from shadowpod.gateway.errors import ApiError, Handler
from shadowpod.journal.leases import Lease, SessionLeases

FORWARDED_BY: Final = "X-Shadowpod-Forwarded-By"
# How much sooner than the lease this replica stops trusting its own memory of it.
TRUST_MARGIN: Final = 0.2
# Headers of one hop only (RFC 9110 §7.6.1), never passed on.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
logger = logging.getLogger(__name__)


class Placement:
    """Which sessions this replica serves, kept by leases."""

    def __init__(
        self,
        leases: SessionLeases,
        replica: str,
        url: str,
        *,
        ttl_s: float,
        on_lost: Callable[[str], None],
    ) -> None:
        self.leases = leases
        self.replica = replica
        self.url = url
        self.ttl_s = ttl_s
        self._on_lost = on_lost
        self._good_until: dict[str, float] = {}  # session -> monotonic deadline
        self._generation: dict[str, int] = {}  # session -> the lease's, while held
        self._handing_over = False
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._client = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def holds(self, session: str) -> bool:
        return self._good_until.get(session, 0.0) > time.monotonic()

    async def where(self, session: str) -> Lease | None:
        """``None``: serve ``session`` here; otherwise the lease of the replica that does."""
        if self.holds(session):
            return None
        if self._handing_over:
            raise ApiError(
                503,
                "ReplicaStopping",
                f"this gateway replica is stopping and has handed session {session!r} over; "
                "retry: another replica serves it",
            )
        proved = time.monotonic()
        lease = await self.leases.claim(session, self.replica, self.url, self.ttl_s)
        if lease.held_by(self.replica):
            self._good_until[session] = proved + self.ttl_s * (1 - TRUST_MARGIN)
            self._generation[session] = lease.generation
            return None
        self._good_until.pop(session, None)
        return lease

    async def serving(self, sessions: Collection[str]) -> dict[str, int]:
        """The sessions among ``sessions`` this replica serves, claiming the free ones
        in one statement, with their lease's generation (the schedule firer's
        ``FiringRight``: only the holder fires a session's schedules)."""
        held = {s: self._generation[s] for s in sessions if self.holds(s)}
        rest = [s for s in sessions if s not in held]
        if rest and not self._handing_over:
            proved = time.monotonic()
            claimed = await self.leases.claim_many(rest, self.replica, self.url, self.ttl_s)
            for session, generation in claimed.items():
                self._good_until[session] = proved + self.ttl_s * (1 - TRUST_MARGIN)
                self._generation[session] = generation
            held.update(claimed)
        return held

    async def renew(self) -> None:
        """Extend the leases held; drop from memory the ones lost."""
        proved = time.monotonic()
        held = await self.leases.renew(self.replica, self.ttl_s)
        for session in list(self._good_until):
            if session in held:
                self._good_until[session] = proved + self.ttl_s * (1 - TRUST_MARGIN)
            else:
                self._lost(session)

    async def run(self) -> None:
        """Renew every ``ttl / 3`` until cancelled."""
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.renew()
            except Exception:
                logger.exception("renewing the session leases failed")
                now = time.monotonic()
                for session, until in list(self._good_until.items()):
                    if until <= now:
                        self._lost(session)

    async def hand_over(self) -> int:
        """Stop serving: release every lease this replica holds."""
        self._handing_over = True
        sessions = list(self._good_until)
        for session in sessions:
            self._lost(session)
        return await self.leases.release(self.replica)

    def _lost(self, session: str) -> None:
        self._good_until.pop(session, None)
        self._generation.pop(session, None)
        logger.info("session lease lost", extra={"session": session})
        try:
            self._on_lost(session)
        except Exception:  # the others are dropped all the same
            logger.exception("dropping session %r after its lease failed", session)

    # --- forwarding -------------------------------------------------------------------

    async def forward(self, request: web.Request, lease: Lease) -> web.StreamResponse:
        assert self._client is not None
        target = lease.url.rstrip("/") + request.rel_url.raw_path_qs
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers[FORWARDED_BY] = self.replica
        try:
            if request.headers.get("Upgrade", "").lower() == "websocket":
                return await self._forward_websocket(request, target, headers)
            body = request.content if request.body_exists else None
            async with self._client.request(
                request.method, target, headers=headers, data=body, allow_redirects=False
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers={
                        k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP
                    },
                )
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientConnectionError as exc:
            raise ApiError(
                503,
                "SessionMoving",
                f"session {request.match_info.get('session')!r} is served by replica "
                f"{lease.holder!r}, which cannot be reached ({exc}); retry: if it died, "
                f"another replica takes the session over within {self.ttl_s:g} s",
            ) from None

    async def _forward_websocket(
        self, request: web.Request, target: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        assert self._client is not None
        for name in ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions"):
            headers.pop(name, None)
        async with self._client.ws_connect(
            target, headers=headers, autoping=True, max_msg_size=0
        ) as upstream:
            downstream = web.WebSocketResponse(autoping=True, max_msg_size=0, compress=False)
            await downstream.prepare(request)

            async def pump(
                source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
                sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
            ) -> None:
                async for message in source:
                    if message.type == WSMsgType.TEXT:
                        await sink.send_str(message.data)
                    elif message.type == WSMsgType.BINARY:
                        await sink.send_bytes(message.data)
                    else:
                        break

            tasks = [
                asyncio.create_task(pump(downstream, upstream)),
                asyncio.create_task(pump(upstream, downstream)),
            ]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            code = upstream.close_code or 1000
            await downstream.close(code=code)
            return downstream


PLACEMENT = web.AppKey("placement", Placement)


@web.middleware
async def placement_middleware(
    request: web.Request,
    handler: Handler,
) -> web.StreamResponse:
    placement = request.app.get(PLACEMENT)
    session = request.match_info.get("session")
    if placement is None or session is None or FORWARDED_BY in request.headers:
        return await handler(request)
    lease = await placement.where(session)
    if lease is None:
        return await handler(request)
    return await placement.forward(request, lease)
