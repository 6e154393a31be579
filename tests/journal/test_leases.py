"""Session leases across gateway replicas (``journal/leases.py``), on PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from shadowpod.domain.ownership import Ownership
from shadowpod.journal.errors import LeaseLost
from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.store import JournalStore
from tests.journal.test_processes import _spawn

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def _leases(store: JournalStore) -> PostgresJournalStore:
    assert isinstance(store, PostgresJournalStore)
    return store


async def test_a_session_is_served_by_the_first_replica_to_claim_it(store: JournalStore) -> None:
    leases = _leases(store).leases
    first = await leases.claim("s", "a", "http://a", 30)
    second = await leases.claim("s", "b", "http://b", 30)
    assert first.held_by("a") and first.url == "http://a"
    assert second == first  # b is told who serves it, and where
    again = await leases.claim("s", "a", "http://a", 30)
    assert again.held_by("a") and again.generation == first.generation
    assert again.expires >= first.expires  # renewed
    assert await leases.holder("s") == again
    assert await leases.renew("a", 30) == {"s"}
    assert await leases.renew("b", 30) == set()


async def test_an_expired_lease_is_taken_over_with_a_new_generation(store: JournalStore) -> None:
    leases = _leases(store).leases
    old = await leases.claim("s", "a", "http://a", 0.2)
    await asyncio.sleep(0.3)
    assert await leases.holder("s") is None
    new = await leases.claim("s", "b", "http://b", 30)
    assert new.held_by("b") and new.generation == old.generation + 1
    # The old holder learns it lost it: no renewal, and a claim names the new holder.
    assert await leases.renew("a", 30) == set()
    assert (await leases.claim("s", "a", "http://a", 30)).held_by("b")


async def test_released_leases_are_free_at_once(store: JournalStore) -> None:
    leases = _leases(store).leases
    for session in ("s", "t", "u"):
        await leases.claim(session, "a", "http://a", 30)
    assert await leases.release("a", ["s"]) == 1
    assert (await leases.claim("s", "b", "http://b", 30)).held_by("b")
    assert (await leases.claim("t", "b", "http://b", 30)).held_by("a")
    assert await leases.release("a") == 2
    assert (await leases.claim("t", "b", "http://b", 30)).held_by("b")


async def test_a_killed_holders_sessions_are_taken_over_within_the_lease_time(
    store: JournalStore,
) -> None:
    ttl, count = 2.0, 20
    leases = _leases(store).leases
    holder = await _spawn(store, "s", "lease-holder", "a", str(ttl), str(count))
    assert holder.stdout is not None
    assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"ready"
    sessions = [f"s{n}" for n in range(count)]
    # Alive, it keeps them past their first expiry: it renews.
    await asyncio.sleep(ttl * 1.5)
    for session in sessions:
        assert (await leases.claim(session, "b", "http://b", ttl)).held_by("a")

    os.kill(holder.pid, signal.SIGKILL)
    killed = time.monotonic()
    await holder.wait()
    taken: dict[str, float] = {}
    while len(taken) < count and time.monotonic() - killed < ttl + 5:
        for session in sessions:
            if session not in taken:
                lease = await leases.claim(session, "b", "http://b", ttl)
                if lease.held_by("b"):
                    taken[session] = time.monotonic() - killed
        await asyncio.sleep(0.05)
    assert set(taken) == set(sessions)
    # The bound: a lease outlives its holder's last renewal (at most TTL/4 before the
    # kill) by TTL; a claim every 50 ms, each a database round trip, adds little.
    assert max(taken.values()) <= ttl + 1.0, taken
    assert min(taken.values()) >= ttl * 0.75 - 0.1, taken


async def test_a_replica_that_lost_the_lease_cannot_change_the_owner(store: JournalStore) -> None:
    pg = _leases(store)
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="old"))
    pg.leases.guard = "a"
    with pytest.raises(LeaseLost):  # never held
        await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="new"))
    await pg.leases.claim("s", "a", "http://a", 0.3)
    bumped = await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="new"))
    assert bumped.epoch == 2
    await asyncio.sleep(0.4)  # expired: another replica takes it over
    assert (await pg.leases.claim("s", "b", "http://b", 30)).held_by("b")
    head = await store.head("s")
    with pytest.raises(LeaseLost):
        await store.compare_and_set_ownership("s", 2, Ownership(epoch=3, owner="newer"))
    assert (await store.get_ownership("s")).epoch == 2  # nothing changed, no marker
    assert await store.head("s") == head


async def test_many_leases_are_claimed_in_one_go_leaving_live_ones_to_their_holders(
    store: JournalStore,
) -> None:
    leases = _leases(store).leases
    mine = await leases.claim("s", "a", "http://a", 30)
    await leases.claim("t", "b", "http://b", 30)
    expired = await leases.claim("u", "b", "http://b", 0.2)
    await asyncio.sleep(0.3)
    claimed = await leases.claim_many(["s", "t", "u", "v"], "a", "http://a", 30)
    # Its own renewed under the same generation, the expired one taken over with a new
    # one, the free one taken; the live lease of b is b's.
    assert claimed == {"s": mine.generation, "u": expired.generation + 1, "v": 1}
    live = await leases.holder("t")
    assert live is not None and live.held_by("b")
    assert await leases.claim_many([], "a", "http://a", 30) == {}
