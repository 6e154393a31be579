"""A full disk is the store's condition, not the gateway's bug: writes answer 503
``StoreFull`` with ``Retry-After`` (nothing was written), and ``/readyz`` reports
not-ready, so traffic goes elsewhere until there is space again."""

from __future__ import annotations

import os

import aiohttp

from shadowpod.journal.sqlite.store import SQLiteJournalStore
from tests.gateway.conftest import RunningGateway, Session, call


async def test_a_full_disk_is_a_503_with_retry_after_and_not_ready(
    http: aiohttp.ClientSession, gateway: RunningGateway, session: Session
) -> None:
    store = gateway.gw.store
    assert isinstance(store, SQLiteJournalStore)
    # The journal's file may grow no further: SQLite's own "database or disk is
    # full" (SQLITE_FULL), as when the volume fills up.
    await store._write(
        session.name,
        lambda tx: tx.conn.execute(
            "PRAGMA max_page_count = " + str(tx.conn.execute("PRAGMA page_count").fetchone()[0])
        ),
    )
    messages = f"{gateway.url}/v1/sessions/{session.name}/messages"
    # Random text: the journal compresses a large payload, and 200 KB of one letter
    # would fit in the pages the file already has.
    content = os.urandom(100_000).hex()
    refused = await call(http, "POST", messages, json={"content": content})
    assert (refused.status, refused.reason) == (503, "StoreFull"), refused.text
    assert "full" in refused.json["message"]
    assert int(refused.headers["Retry-After"]) > 0
    ready = await call(http, "GET", f"{gateway.url}/readyz")
    assert ready.status == 503
    assert int(ready.headers["Retry-After"]) > 0
    events = await call(http, "GET", f"{gateway.url}/v1/sessions/{session.name}/events")
    assert events.json["events"] == []  # nothing was journaled
