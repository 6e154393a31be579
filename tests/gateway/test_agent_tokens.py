"""A session's agent token, as checked by one gateway replica while another may
delete and re-create the session (a new token) in the shared journal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from shadowpod.gateway.auth import AGENT_TOKEN_TTL_S, Authenticator
from shadowpod.gateway.errors import ApiError
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.sessions.tokens import AGENT_TOKEN_META, new_token, token_hash


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteJournalStore]:
    async with SQLiteJournalStore(tmp_path / "journal.db") as journal:
        yield journal


async def _create(store: SQLiteJournalStore, session: str) -> str:
    token = new_token()
    await store.create_session(session, meta={AGENT_TOKEN_META: token_hash(token)})
    return token


async def _accepted(auth: Authenticator, session: str, token: str) -> bool:
    """Whether ``token`` passes as ``session``'s agent token (False: refused with 401)."""
    request = make_mocked_request("GET", "/", headers={"Authorization": f"Bearer {token}"})
    try:
        await auth.agent(request, session)
    except ApiError as exc:
        refused = exc
    else:
        return True
    assert refused.status == 401, refused
    return False


async def test_a_token_replaced_by_another_replica_stops_working_within_the_ttl(
    store: SQLiteJournalStore,
) -> None:
    clock = Clock()
    auth = Authenticator(store, frozenset(), frozenset(), clock=clock)
    old = await _create(store, "s")
    assert await _accepted(auth, "s", old)

    # Another replica deletes and re-creates the session: a new agent token.
    await store.delete_session("s")
    new = await _create(store, "s")

    clock.now += AGENT_TOKEN_TTL_S / 2  # still trusted from memory here
    assert await _accepted(auth, "s", old)
    clock.now += AGENT_TOKEN_TTL_S
    assert not await _accepted(auth, "s", old)
    assert await _accepted(auth, "s", new)


async def test_a_wrong_token_is_refused_and_the_right_one_still_works(
    store: SQLiteJournalStore,
) -> None:
    auth = Authenticator(store, frozenset(), frozenset(), clock=Clock())
    token = await _create(store, "s")
    assert not await _accepted(auth, "s", new_token())
    assert await _accepted(auth, "s", token)
