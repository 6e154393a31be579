"""A separate writer process for the journal tests (run as a script, not collected).

    writer_proc.py <backend> <location> <session> <mode> [args...]

``location`` is a SQLite path, or ``<dsn>|<schema>`` for PostgreSQL. Modes:

- ``append-and-die N``: append N entries, print their seqs, then exit at once with no
  cleanup (``os._exit``), as a crash would right after the acknowledgement.
- ``writer PREFIX N``: append N single entries with ids PREFIX-k, print "done".
- ``owner EPOCH``: append as owner at EPOCH until fenced, print the last accepted seq.
- ``lease-holder REPLICA TTL COUNT`` (PostgreSQL): claim the leases of sessions
  ``<session>0`` .. ``<session>COUNT-1``, print "ready", renew them every TTL/4 until
  killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from shadowpod.domain.entries import NewEntry
from shadowpod.journal.errors import Fenced
from shadowpod.journal.store import JournalStore


def _store(backend: str, location: str) -> JournalStore:
    if backend == "sqlite":
        from shadowpod.journal.sqlite.store import SQLiteJournalStore

        return SQLiteJournalStore(location)
    from shadowpod.journal.postgres.store import PostgresJournalStore

    dsn, schema = location.split("|")
    return PostgresJournalStore(dsn, schema=schema)


def _entry(id: str, role: str = "user") -> NewEntry:
    return NewEntry(id=id, kind="message", payload={"role": role, "content": id})


async def main(backend: str, location: str, session: str, mode: str, *args: str) -> None:
    store = _store(backend, location)
    await store.open()
    if mode == "append-and-die":
        results = await store.append(session, [_entry(f"durable-{n}") for n in range(int(args[0]))])
        print(json.dumps([r.seq for r in results]), flush=True)
        os._exit(0)
    if mode == "writer":
        prefix, count = args[0], int(args[1])
        for k in range(count):
            await store.append(session, [_entry(f"{prefix}-{k}")])
        print("done", flush=True)
    elif mode == "owner":
        epoch, last, k = int(args[0]), 0, 0
        print("ready", flush=True)
        while True:
            try:
                [result] = await store.append(
                    session, [_entry(f"owner-{k}", "assistant")], owner_epoch=epoch
                )
            except Fenced:
                break
            last, k = result.seq, k + 1
        print(json.dumps({"last": last, "count": k}), flush=True)
    elif mode == "lease-holder":
        from shadowpod.journal.postgres.store import PostgresJournalStore

        assert isinstance(store, PostgresJournalStore)
        replica, ttl, count = args[0], float(args[1]), int(args[2])
        for n in range(count):
            lease = await store.leases.claim(f"{session}{n}", replica, f"http://{replica}", ttl)
            assert lease.held_by(replica), lease
        print("ready", flush=True)
        while True:
            await asyncio.sleep(ttl / 4)
            await store.leases.renew(replica, ttl)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
