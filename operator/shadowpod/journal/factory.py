"""Open a journal store from a URL: ``sqlite:///path/journal.db`` or ``postgresql://...``."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from shadowpod.journal.store import JournalStore


def store_from_url(url: str) -> JournalStore:
    """The store a URL names (not yet opened).

    ``sqlite:///abs/path.db`` or ``sqlite:relative/path.db``; ``postgresql://`` DSNs
    take an optional ``shadowpod_schema`` query parameter (default ``shadowpod``).
    """
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        from shadowpod.journal.sqlite.store import SQLiteJournalStore

        path = parts.path if parts.netloc == "" else f"{parts.netloc}{parts.path}"
        if not path or path.endswith("/"):
            raise ValueError(f"journal URL {url!r} names no file: use sqlite:///path/journal.db")
        # sqlite:////abs/path.db (SQLAlchemy's spelling of an absolute path) means the same.
        return SQLiteJournalStore(Path("/" + path.lstrip("/") if path.startswith("/") else path))
    if parts.scheme in ("postgresql", "postgres"):
        from shadowpod.journal.postgres.store import PostgresJournalStore

        query = parse_qs(parts.query)
        schema = query.pop("shadowpod_schema", ["shadowpod"])[-1]
        rest = "&".join(f"{key}={value}" for key, values in query.items() for value in values)
        dsn = parts._replace(query=rest).geturl()
        return PostgresJournalStore(dsn, schema=schema)
    raise ValueError(
        f"unsupported journal URL {url!r}: use sqlite:///path/journal.db or postgresql://host/db"
    )
