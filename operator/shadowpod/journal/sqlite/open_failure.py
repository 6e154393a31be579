"""What went wrong when a SQLite journal could not be opened, said so a person can fix
it: SQLite itself only says "unable to open database file" or "file is not a database"."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from shadowpod.journal.errors import StoreUnusable


def open_failure(path: Path, exc: OSError | sqlite3.Error) -> StoreUnusable:
    shown = path.absolute()
    if shown.is_dir():
        return StoreUnusable(
            f"the SQLite journal {shown} is a directory: name a file in it, "
            f"e.g. sqlite://{shown / 'journal.db'}"
        )
    ancestor = _existing_ancestor(shown.parent)
    if not ancestor.is_dir():
        return StoreUnusable(
            f"cannot create the SQLite journal {shown}: {ancestor} is a file, not a directory; "
            "choose another path"
        )
    if isinstance(exc, PermissionError) or not os.access(ancestor, os.W_OK | os.X_OK):
        return StoreUnusable(
            f"cannot create the SQLite journal {shown}: this user may not write in {ancestor}; "
            "choose a writable directory or fix its permissions"
        )
    message = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in message or "malformed" in message
    ):
        return StoreUnusable(
            f"{shown} is not a SQLite database (or it is damaged): point the journal URL at a "
            "new file or at an existing Shadowpod journal"
        )
    if "readonly" in message or "read-only" in message:
        return StoreUnusable(
            f"the SQLite journal {shown} is read-only: give this user write access to it and "
            "its directory (the write-ahead log lives next to it)"
        )
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return StoreUnusable(
            f"cannot create the SQLite journal {shown}: {exc.strerror}{where}; choose another path"
        )
    return StoreUnusable(f"cannot open the SQLite journal {shown}: {message}")


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
