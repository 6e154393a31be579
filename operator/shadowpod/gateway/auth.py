"""Bearer tokens: a control token, a per-session agent token, optional client tokens.

Tokens are compared as SHA-256 hashes in constant time and never logged.
"""

from __future__ import annotations

from aiohttp import web

from shadowpod.gateway.errors import ApiError
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.tokens import AGENT_TOKEN_META, any_token_matches, token_matches


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
    ) -> None:
        self._store = store
        self._control = control_hashes
        self._clients = client_hashes
        self._agent_hashes: dict[str, str] = {}

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
        expected = self._agent_hashes.get(session)
        if expected is None:
            info = await self._store.get_session(session)  # 404 for unknown sessions
            expected = info.meta.get(AGENT_TOKEN_META, "")
            self._agent_hashes[session] = expected
        if not expected or not token_matches(token, expected):
            raise ApiError(
                401, "Unauthorized", f"this route needs the agent token of session {session!r}"
            )

    def forget(self, session: str) -> None:
        self._agent_hashes.pop(session, None)
