"""A store driven from synchronous code (hypothesis' @given and state machines), on an
event loop of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from shadowpod.journal.store import JournalStore
from tests.conftest import StoreFactory

T = TypeVar("T")


@dataclass
class SyncStore:
    store: JournalStore
    runner: asyncio.Runner

    def __call__(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)


@pytest.fixture
def sync_store(store_factory: StoreFactory) -> Iterator[SyncStore]:
    with asyncio.Runner() as runner:
        store = store_factory()
        runner.run(store.open())
        try:
            yield SyncStore(store, runner)
        finally:
            runner.run(store.close())
