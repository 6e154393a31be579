"""Bearer tokens: a control token, a per-session agent token, optional client tokens;
and on the owner routes, the owner credential of the instance that writes.

Tokens are compared as SHA-256 hashes in constant time and never logged. The agent
token is the session's: every instance of it (owner, shadows, a replaced owner) holds
it. What tells the owner apart is its credential (``sessions.tokens.owner_credential``,
minted by the control plane for each instance it starts): the stores then write only
as the instance the ownership record names at the epoch, in the write's transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from aiohttp import web

from shadowpod.gateway.errors import ApiError
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.tokens import (
    AGENT_TOKEN_META,
    INSTANCE_HEADER,
    OWNER_CREDENTIAL_HEADER,
    OWNER_KEY_META,
    any_token_matches,
    owner_credential_matches,
    token_matches,
)

# How long a session's agent token hash is trusted from memory. Agent requests are
# many (every append, ack and read); the hash is read from the journal's session
# record at most this often. A session deleted and re-created through another gateway
# replica gets a new token there: this bounds how long the old one still works here.
AGENT_TOKEN_TTL_S: Final = 5.0
# The longest instance name (a Kubernetes object name).
MAX_INSTANCE: Final = 253


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
        # session -> (agent token hash, owner key, read at)
        self._records: dict[str, tuple[str, str, float]] = {}

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
        await self._agent_token(session, token)

    async def owner(self, request: web.Request, session: str) -> str | None:
        """The agent token, and the owner credential of the instance that presents it
        (``Shadowpod-Instance``, ``Shadowpod-Owner-Credential``): that instance's name,
        for the store to write only as the owner the record names. ``None`` for the
        control token, and for a session made without an owner key (the epoch alone
        is then checked)."""
        token = bearer(request)
        if any_token_matches(token, self._control):
            return None
        owner_key = await self._agent_token(session, token)
        if not owner_key:
            return None
        instance = request.headers.get(INSTANCE_HEADER, "").strip()
        credential = request.headers.get(OWNER_CREDENTIAL_HEADER, "").strip()
        if not (
            instance
            and len(instance) <= MAX_INSTANCE
            and credential
            and owner_credential_matches(owner_key, session, instance, credential)
        ):
            raise ApiError(
                401,
                "Unauthorized",
                f"owner routes of session {session!r} need the owner credential of the "
                f"instance that writes, in the {INSTANCE_HEADER} and "
                f"{OWNER_CREDENTIAL_HEADER} headers; whoever started the instance mints it "
                "(POST /v1/sessions/{session}/owner-credentials, control token)",
            )
        return instance

    async def _agent_token(self, session: str, token: str) -> str:
        """Check ``token`` is the session's agent token; the session's owner key."""
        now = self._clock()
        cached = self._records.get(session)
        if cached is not None and now - cached[2] < self._ttl:
            expected, owner_key = cached[0], cached[1]
        else:
            info = await self._store.get_session(session)  # 404 for unknown sessions
            expected = info.meta.get(AGENT_TOKEN_META, "")
            owner_key = info.meta.get(OWNER_KEY_META, "")
            self._records[session] = (expected, owner_key, now)
        if not expected or not token_matches(token, expected):
            raise ApiError(
                401, "Unauthorized", f"this route needs the agent token of session {session!r}"
            )
        return owner_key

    def forget(self, session: str) -> None:
        self._records.pop(session, None)
