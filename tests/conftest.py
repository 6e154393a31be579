"""Shared fixtures: journal stores on both backends."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.journal.store import JournalStore

PG_DSN = os.environ.get("SHADOWPOD_TEST_PG", "postgresql://127.0.0.1:5432/test")


def pytest_configure(config: pytest.Config) -> None:
    """What images' code said of their schemas is cached per image
    (shadowpod.local.images): the tests' own cache, not the user's ``~/.cache``, so a
    run neither reads what another build said nor leaves anything behind."""
    if "SHADOWPOD_DESCRIBED_IMAGES" not in os.environ:
        made = tempfile.mkdtemp(prefix="shadowpod-described-")
        os.environ["SHADOWPOD_DESCRIBED_IMAGES"] = made
        config.add_cleanup(lambda: shutil.rmtree(made, ignore_errors=True))


StoreFactory = Callable[[], JournalStore]


def default_sigint() -> None:
    """A child's ``preexec_fn``: Ctrl-C as a terminal delivers it. A test run started
    in the background of a non-interactive shell (``make test &``, some CI runners)
    ignores SIGINT, and its children would inherit that: a test of what Ctrl-C does
    would then see the signal ignored, as the shell meant, and fail."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@functools.cache
def postgres_unavailable() -> str | None:
    """Why PostgreSQL tests cannot run here, or ``None`` when they can."""
    try:
        psycopg.connect(PG_DSN, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL answers at {PG_DSN} (set SHADOWPOD_TEST_PG): {exc}"
    return None


def drop_pg_schema(schema: str) -> None:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # test-made name


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(reason)
    return name


@pytest.fixture
def store_factory(backend: str, tmp_path: Path) -> Iterator[StoreFactory]:
    """Makes (unopened) handles on one database: several handles act like several processes."""
    if backend == "sqlite":
        path = tmp_path / "journal.db"
        yield lambda: SQLiteJournalStore(path)
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield lambda: PostgresJournalStore(PG_DSN, schema=schema)
    drop_pg_schema(schema)


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[JournalStore]:
    opened = store_factory()
    await opened.open()
    yield opened
    await opened.close()
