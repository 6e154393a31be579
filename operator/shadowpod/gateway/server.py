"""The HTTP server under the app: limits on connections, and JSON where aiohttp answers.

aiohttp answers some requests before any route or middleware sees them: a request it
cannot parse (a bad request line or header, a header too long) gets a ``text/plain``
400. Here those answers are the gateway's JSON error body too.

Slow clients: a client that opens connections and trickles its headers (or keeps them
idle) holds a socket and a little memory each. So:

- at most ``max_connections_per_peer`` connections per client address at once; one
  more is answered 503 ``TooManyConnections`` and closed;
- the headers of a request must arrive within ``header_timeout_s`` of the connection
  opening or of the previous answer (aiohttp's keep-alive timer, which also closes
  idle connections); bodies are read by the routes with their own timeouts
  (``shadowpod.gateway.errors.read_raw_body``);
- a body a route refused is drained for at most ``LINGER_S`` before the connection is
  closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from http import HTTPStatus
from typing import Any, Final

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from shadowpod.api.models import ErrorBody

logger = logging.getLogger(__name__)

# How long a body that was refused (413) is read and dropped, so a client still
# sending it reads the answer instead of a reset.
LINGER_S: Final = 2.0


# What a parse error means, said without quoting the request.
UNPARSEABLE: Final = {
    "LineTooLong": "the request line or a header line is longer than 8190 bytes",
    "BadStatusLine": "the request line is malformed",
    "BadHttpMethod": "the method is not a valid HTTP method",
    "InvalidHeader": "a header is malformed",
    "InvalidURLError": "the request target is malformed",
}


def error_json(status: int, reason: str, message: str) -> bytes:
    return orjson.dumps(ErrorBody(reason=reason, message=message).model_dump())


class PeerLimit:
    """Connections open per client address."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()
        self.refused = 0

    def admit(self, peer: str) -> bool:
        if self.limit and self.open[peer] >= self.limit:
            self.refused += 1
            return False
        self.open[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.open[peer] -= 1
        if self.open[peer] <= 0:
            del self.open[peer]


class GatewayRequestHandler(RequestHandler):
    """aiohttp's protocol, with a per-address connection limit and JSON errors."""

    def __init__(self, manager: web.Server, *, peers: PeerLimit, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._peers = peers
        self._peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else "unknown"
        if not self._peers.admit(peer):
            limit = self._peers.limit
            body = error_json(
                503,
                "TooManyConnections",
                f"{peer} already holds {limit} connections to this gateway, the most one "
                "address may hold; reuse connections (keep-alive) or close idle ones",
            )
            assert isinstance(transport, asyncio.Transport)
            transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            transport.close()
            return  # no request is read from this connection
        self._peer = peer
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._peer is None:
            return  # refused in connection_made: aiohttp never saw it
        self._peers.release(self._peer)
        self._peer = None
        super().connection_lost(exc)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse (or a failure outside the
        app's middlewares), as the gateway's JSON error body.

        A parse error's text quotes the bytes it choked on — the first bytes of an
        ``Authorization`` header, say — so for a 4xx neither the answer nor the log
        carries it: both name the kind of error only.
        """
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs; may raise
            reason, text = "InternalError", "an unexpected error occurred; see the gateway log"
        else:
            if request.writer.output_size > 0:  # some of an answer went out already
                raise ConnectionError("cannot answer a request whose answer has started")
            kind = type(exc).__name__ if exc is not None else "BadRequest"
            self.logger.info("unparseable request from %s: %s", request.remote, kind)
            reason = "BadRequest" if status == 400 else HTTPStatus(status).phrase.replace(" ", "")
            what = UNPARSEABLE.get(kind, f"malformed HTTP ({kind})")
            text = f"the request could not be parsed: {what}"
        response = web.Response(
            status=status,
            body=error_json(status, reason, text),
            content_type="application/json",
        )
        response.force_close()
        return response


class GatewayServer(web.Server):
    def __init__(self, *args: Any, max_connections_per_peer: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peers = PeerLimit(max_connections_per_peer)

    def __call__(self) -> RequestHandler:
        return GatewayRequestHandler(self, peers=self.peers, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """An ``AppRunner`` whose connections are ``GatewayRequestHandler``s."""

    def __init__(
        self,
        app: web.Application,
        *,
        max_connections_per_peer: int,
        header_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("access_log", None)
        # Until the headers of each request are in (and the longest a connection
        # stays idle): aiohttp's keep-alive timer runs from the connection's start
        # and from the end of each answer, and closes a connection still waiting.
        kwargs["keepalive_timeout"] = header_timeout_s
        kwargs["lingering_time"] = LINGER_S
        super().__init__(app, **kwargs)
        self._max_per_peer = max_connections_per_peer

    async def _make_server(self) -> web.Server:
        # aiohttp's own server (the app started, its handler arguments applied), rebuilt
        # with the same arguments as a GatewayServer.
        plain = await super()._make_server()
        return GatewayServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            max_connections_per_peer=self._max_per_peer,
            **plain._kwargs,
        )
