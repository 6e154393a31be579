"""Bearer tokens: a control token, a per-session agent token, optional client tokens.

Tokens are compared as SHA-256 hashes in constant time and never logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from aiohttp import web

from shadowpod.gateway.errors import ApiError
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.tokens import AGENT_TOKEN_META, any_token_matches, token_matches

# How long a session's agent token hash is trusted from memory. Agent requests are
# many (every append, ack and read); the hash is read from the journal's session
# record at most this often. A session deleted and re-created through another gateway
# replica gets a new token there: this bounds how long the old one still works here.
AGENT_TOKEN_TTL_S: Final = 5.0


def bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "Unauthorized", "send 'Authorization: Bearer <token>'")
    return token.strip()


class Authenticator:
    def __init__(
        self,
        store: JournalStore,
        control_hashes: frozenset[str],
        client_hashes: frozenset[str],
        *,
        agent_token_ttl_s: float = AGENT_TOKEN_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._control = control_hashes
        self._clients = client_hashes
        self._ttl = agent_token_ttl_s
        self._clock = clock
        self._agent_hashes: dict[str, tuple[str, float]] = {}  # session -> (hash, read at)

    def control(self, request: web.Request) -> None:
        if not any_token_matches(bearer(request), self._control):
            raise ApiError(401, "Unauthorized", "this route needs the gateway's control token")

    def client(self, request: web.Request) -> None:
        """Clients need a token only when the gateway was given client tokens."""
        if not self._clients:
            return
        token = bearer(request)
        if not (any_token_matches(token, self._clients) or any_token_matches(token, self._control)):
            raise ApiError(401, "Unauthorized", "this route needs a client token")

    async def agent(self, request: web.Request, session: str) -> None:
        """The session's agent token (the control token is accepted too)."""
        token = bearer(request)
        if any_token_matches(token, self._control):
            return
        now = self._clock()
        cached = self._agent_hashes.get(session)
        if cached is not None and now - cached[1] < self._ttl:
            expected = cached[0]
        else:
            info = await self._store.get_session(session)  # 404 for unknown sessions
            expected = info.meta.get(AGENT_TOKEN_META, "")
            self._agent_hashes[session] = (expected, now)
        if not expected or not token_matches(token, expected):
            raise ApiError(
                401, "Unauthorized", f"this route needs the agent token of session {session!r}"
            )

    def forget(self, session: str) -> None:
        self._agent_hashes.pop(session, None)
