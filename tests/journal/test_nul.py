"""A NUL character (U+0000) in what is journaled, on PostgreSQL: its text and jsonb
cannot hold one, so it is refused as a bad argument (HTTP 400 at the gateway), with
nothing written, and a payload without one still goes in."""

from __future__ import annotations

import pytest

from shadowpod.journal import JournalStore
from shadowpod.journal.errors import InvalidArgument
from tests.journal.test_idempotency import user

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


async def test_a_nul_in_a_payload_is_refused_before_anything_is_written(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    with pytest.raises(InvalidArgument, match="NUL character"):
        await store.append("s", [user("fine", "a"), user("bad\x00", "b")])
    with pytest.raises(InvalidArgument, match="NUL character"):
        await store.create_session("t", meta={"k": "v\x00"})
    assert await store.head("s") == 0
    [ok] = await store.append("s", [user("fine", "a")])
    assert ok.seq == 1
