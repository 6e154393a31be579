"""PostgreSQL-only guarantees: several writer processes, schema checks, reachability."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.errors import SchemaTooNew
from shadowpod.domain.ownership import Ownership
from shadowpod.journal.errors import StoreUnavailable
from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.store import JournalStore, Writer
from tests.conftest import PG_DSN
from tests.journal.test_processes import _output, _spawn

# Several writer processes are PostgreSQL's guarantee; SQLite is specified for one.
pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


async def test_two_writer_processes_on_one_session_produce_gap_free_seqs(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    writers = [await _spawn(store, "s", "writer", name, "150") for name in ("a", "b")]
    for writer in writers:
        assert (await _output(writer)).strip() == "done"
    entries = await store.read("s", 0, 1000)
    assert [e.seq for e in entries] == list(range(1, 301))
    for name in ("a", "b"):  # each process's entries kept their own order
        mine = [int(e.id.split("-")[1]) for e in entries if e.id.startswith(f"{name}-")]
        assert mine == list(range(150))


async def test_an_epoch_bump_from_another_process_fences_a_writing_owner(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="old"))
    owner = await _spawn(store, "s", "owner", "1")
    assert owner.stdout is not None
    assert (await asyncio.wait_for(owner.stdout.readline(), 30)).strip() == b"ready"
    async for entry in store.follow("s"):  # let it write for a while
        if entry.seq >= 50:
            break
    bumped = await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="new"))
    report = json.loads(await _output(owner))
    assert bumped.fence_seq is not None
    assert report["last"] < bumped.fence_seq
    entries = await store.read("s", 0, 100_000)
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    assert not [e for e in entries if e.epoch == 1 and e.seq > bumped.fence_seq]
    owner_writes = [e for e in entries if e.epoch == 1 and e.kind == "message"]
    assert len(owner_writes) == report["count"]


async def test_a_database_written_by_a_newer_shadowpod_is_refused(store: JournalStore) -> None:
    assert isinstance(store, PostgresJournalStore)
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"UPDATE {store.schema}.meta SET value = '7' WHERE key = 'schema_version'")
    newer = PostgresJournalStore(PG_DSN, schema=store.schema)
    with pytest.raises(SchemaTooNew, match="journal database has schema v7.*up to v2"):
        await newer.open()


async def test_an_unreachable_server_is_a_clear_error(backend: str) -> None:
    store = PostgresJournalStore("postgresql://127.0.0.1:1/none?connect_timeout=2")
    with pytest.raises(StoreUnavailable, match="cannot reach PostgreSQL"):
        await store.open()


async def test_several_stores_may_create_the_schema_at_once(store: JournalStore) -> None:
    assert isinstance(store, PostgresJournalStore)
    schema = store.schema + "_race"
    stores = [PostgresJournalStore(PG_DSN, schema=schema) for _ in range(4)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        await stores[0].create_session("s")
        assert [i.session for i in await stores[3].list_sessions()] == ["s"]
    finally:
        for s in stores:
            await s.close()
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_schema_names_are_checked(backend: str) -> None:
    with pytest.raises(ValueError, match="invalid PostgreSQL schema name"):
        PostgresJournalStore(PG_DSN, schema="x; DROP TABLE y")


async def test_a_version_1_database_is_brought_up_with_its_ids_kept_per_writer(
    store: JournalStore,
) -> None:
    assert isinstance(store, PostgresJournalStore)
    await store.create_session("s")
    await store.append(
        "s", [NewEntry(id="m-1", kind="message", payload={"role": "user", "content": "hi"})]
    )
    s = store.schema
    with psycopg.connect(PG_DSN, autocommit=True) as conn:  # as version 1 left it
        conn.execute(f"ALTER TABLE {s}.entries DROP COLUMN scope")
        conn.execute(f"ALTER TABLE {s}.entries ADD CONSTRAINT entries_sid_id_key UNIQUE (sid, id)")
        conn.execute(f"UPDATE {s}.meta SET value = '1' WHERE key = 'schema_version'")
    async with PostgresJournalStore(PG_DSN, schema=s) as upgraded:
        message = NewEntry(id="m-1", kind="message", payload={"role": "user", "content": "hi"})
        [again] = await upgraded.append("s", [message], writer=Writer.CLIENT)
        assert (again.seq, again.duplicate) == (1, True)
        [other] = await upgraded.append(
            "s", [NewEntry(id="m-1", kind="message", payload={"role": "system", "content": "x"})]
        )
        assert not other.duplicate
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        version = conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema_version'")
        assert version.fetchone() == ("2",)


async def test_a_large_payload_is_stored_compressed_by_postgresql(store: JournalStore) -> None:
    # PostgreSQL compresses a value of a row over ~2 KB itself (TOAST, pglz; a marker
    # in the value's header says how each is stored): a framework agent's state entry
    # takes a fraction of its JSON, as in the SQLite store (``codec.stored_payload``).
    assert isinstance(store, PostgresJournalStore)
    values = {f"channel-{i}": f"value {i} of the agent's state, " * 3 for i in range(40)}
    await store.create_session("s")
    await store.append("s", [NewEntry(kind="state", payload={"values": values})])
    async with await psycopg.AsyncConnection.connect(PG_DSN) as conn:
        cursor = await conn.execute(
            f"SELECT pg_column_size(payload), octet_length(payload::text) "
            f"FROM {store.schema}.entries WHERE kind = 'state'"
        )
        stored, json_bytes = await cursor.fetchone() or (0, 0)
    assert json_bytes > 3_000
    assert stored < json_bytes / 3
