"""Guarantees that need more than one process: durability and multi-writer safety."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.journal.store import JournalStore
from tests.conftest import StoreFactory

WRITER = Path(__file__).parent / "writer_proc.py"


def _location(store: JournalStore) -> str:
    if isinstance(store, SQLiteJournalStore):
        return str(store.path)
    assert isinstance(store, PostgresJournalStore)
    return f"{store.dsn}|{store.schema}"


async def _spawn(store: JournalStore, session: str, *args: str) -> asyncio.subprocess.Process:
    backend = "sqlite" if isinstance(store, SQLiteJournalStore) else "postgres"
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(WRITER),
        backend,
        _location(store),
        session,
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def _output(process: asyncio.subprocess.Process) -> str:
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    return stdout.decode()


async def test_an_acknowledged_append_survives_the_writer_dying_at_once(
    store: JournalStore, store_factory: StoreFactory
) -> None:
    await store.create_session("s")
    await store.close()  # the dying process is the only one with the database open
    seqs = json.loads(await _output(await _spawn(store, "s", "append-and-die", "50")))
    assert seqs == list(range(1, 51))

    reopened = store_factory()
    await reopened.open()
    try:
        entries = await reopened.read("s", 0, 100)
        assert [e.id for e in entries] == [f"durable-{n}" for n in range(50)]
    finally:
        await reopened.close()
    await store.open()  # for the fixture's teardown
