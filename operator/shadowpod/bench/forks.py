"""``shadowpod bench fork``: what forking a session costs, against creating one.

On each backend (SQLite in a temporary directory; PostgreSQL in a schema of its own,
dropped after), for each journal length: a parent session of that many entries (turns
of a user message, a reply and an ack, with a snapshot of ~64 KiB at its last acked
turn), then ``rounds`` forks of it at its head, each timed from the call to the store's
answer, and as many plain session creations beside them. A fork shares its parent's
journal (``journal/forks.py``): its time should not grow with the parent's length. Each
fork's first read of the parent's journal (one page of 1,000 from its start) is timed
too, as a new owner's first replay page.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from shadowpod.bench.machine import MachineProbe
from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.journal.store import ForkPoint, JournalStore
from shadowpod.stats import summary_ms

BATCH = 999  # entries per append while the parent is filled: 333 turns


@dataclass(frozen=True)
class ForkBenchConfig:
    lengths: tuple[int, ...] = (10, 10_000, 100_000)
    rounds: int = 20
    backends: tuple[str, ...] = ("sqlite", "postgres")
    dsn: str = "postgresql://127.0.0.1:5432/test"


@asynccontextmanager
async def _store(backend: str, dsn: str) -> AsyncIterator[JournalStore]:
    if backend == "sqlite":
        workdir = Path(tempfile.mkdtemp(prefix="shadowpod-bench-fork-"))
        store = SQLiteJournalStore(workdir / "journal.db")
        await store.open()
        try:
            yield store
        finally:
            await store.close()
            shutil.rmtree(workdir, ignore_errors=True)
        return
    import psycopg

    from shadowpod.journal.postgres.store import PostgresJournalStore

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    pg = PostgresJournalStore(dsn, schema=schema)
    await pg.open()
    try:
        yield pg
    finally:
        await pg.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def _parent(store: JournalStore, name: str, length: int) -> int:
    """A session of ``length`` entries (epoch marker, then turns) and a snapshot."""
    await store.create_session(name)
    await store.compare_and_set_ownership(name, 0, Ownership(epoch=1, owner="bench"))
    head = 1
    while head < length:
        n = min(BATCH, length - head) // 3 or 1
        user = [
            NewEntry(kind="message", payload={"role": "user", "content": f"m{head + 3 * i + 1}"})
            for i in range(n)
        ]
        inbound = await store.append(name, user)
        outputs = [
            e
            for a in inbound
            for e in (
                NewEntry(
                    kind="message",
                    payload={"role": "assistant", "content": "ok " * 20, "turn": a.seq},
                ),
                NewEntry(kind="ack", payload={"turn": a.seq}),
            )
        ]
        done = await store.append(name, outputs, owner_epoch=1)
        head = done[-1].seq
    document = orjson.dumps({"watermark": head, "values": {"notes": "x" * 65_536}})
    await store.put_snapshot(name, watermark=head, schema_version=3, document_json=document)
    return head


async def _one(store: JournalStore, length: int, rounds: int) -> dict[str, Any]:
    parent = f"p{length}"
    filled = time.perf_counter()
    head = await _parent(store, parent, length)
    filled = time.perf_counter() - filled
    forks, creates, first_pages = [], [], []
    for n in range(rounds):
        started = time.perf_counter()
        await store.create_session(f"f{length}-{n}", fork=ForkPoint(parent, head))
        forks.append(time.perf_counter() - started)
        started = time.perf_counter()
        await store.read(f"f{length}-{n}", 0, 1000)
        first_pages.append(time.perf_counter() - started)
        started = time.perf_counter()
        await store.create_session(f"c{length}-{n}")
        creates.append(time.perf_counter() - started)
    return {
        "entries": head,
        "fill_s": round(filled, 3),
        "fork_ms": summary_ms(forks),
        "create_ms": summary_ms(creates),
        "fork_first_page_ms": summary_ms(first_pages),
    }


async def run_fork_bench(config: ForkBenchConfig) -> dict[str, Any]:
    probe = MachineProbe()
    probe.start()
    results: dict[str, list[dict[str, Any]]] = {}
    for backend in config.backends:
        async with _store(backend, config.dsn) as store:
            results[backend] = [await _one(store, n, config.rounds) for n in config.lengths]
    return {
        "benchmark": "fork",
        "rounds": config.rounds,
        "results": results,
        "machine": probe.report(),
    }
