"""A session ``s`` owned by ``a`` at epoch 1, on a real SQLite journal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shadowpod.domain.ownership import Ownership
from shadowpod.journal.sqlite.store import SQLiteJournalStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteJournalStore]:
    async with SQLiteJournalStore(tmp_path / "j.db") as opened:
        await opened.create_session("s")
        await opened.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="a"))
        yield opened
