"""Snapshots written as an owner are fenced like its appends, on every backend: a
fenced-out owner (or another instance) cannot replace what the next owner restores."""

from __future__ import annotations

import pytest

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.journal import Fenced, JournalStore
from shadowpod.journal.errors import OwnerMismatch

DOCUMENT = b'{"watermark": 2}'


async def handed_over(store: JournalStore) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    await store.append("s", [NewEntry(kind="message", payload={"role": "user", "content": "hi"})])
    await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="pod-b"))


async def test_a_fenced_out_owner_cannot_store_a_snapshot(store: JournalStore) -> None:
    await handed_over(store)
    with pytest.raises(Fenced) as refused:
        await store.put_snapshot(
            "s", watermark=2, schema_version=1, document_json=DOCUMENT, owner_epoch=1
        )
    assert refused.value.current == 2
    assert await store.list_snapshots("s") == []


async def test_only_the_instance_named_at_the_epoch_stores_a_snapshot(store: JournalStore) -> None:
    await handed_over(store)
    with pytest.raises(OwnerMismatch):
        await store.put_snapshot(
            "s", watermark=2, schema_version=1, document_json=DOCUMENT, owner_epoch=2, owner="pod-a"
        )
    stored = await store.put_snapshot(
        "s", watermark=2, schema_version=1, document_json=DOCUMENT, owner_epoch=2, owner="pod-b"
    )
    assert [s.watermark for s in await store.list_snapshots("s")] == [stored.watermark]
