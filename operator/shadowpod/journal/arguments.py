"""The integers callers hand to a store, checked before any query.

Seqs, epochs and limits end up in 64-bit columns and statement parameters; a value
beyond them made the drivers raise ``OverflowError`` (a 500 at the gateway) instead
of saying which argument was wrong. A boolean is not an integer here either.
"""

from __future__ import annotations

from shadowpod.domain.bounds import INT32_MAX, INT64_MAX
from shadowpod.journal.errors import InvalidArgument


def check_int(name: str, value: object, *, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer ({what}), got {value!r}")
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be from {low} to {high} ({what}), got {value}")
    return value


def check_seq(name: str, value: object) -> int:
    return check_int(name, value, low=0, high=INT64_MAX, what="a journal seq, 0 for the start")


def check_read(after: object, limit: object) -> None:
    check_seq("after", after)
    check_int("limit", limit, low=1, high=INT64_MAX, what="how many entries to read")


def check_epoch(name: str, value: object) -> int:
    return check_int(name, value, low=0, high=INT64_MAX, what="an owner epoch, 0 for no owner")


def check_owner_epoch(value: object) -> int | None:
    """An owner write's epoch: owners write at 1 and up (0 is 'no owner', not a writer)."""
    if value is None:
        return None
    return check_int("owner_epoch", value, low=1, high=INT64_MAX, what="the writing owner's epoch")


def check_schema_version(value: object) -> int:
    return check_int(
        "schema_version", value, low=1, high=INT32_MAX, what="the state document's schema"
    )


def check_keep(value: object) -> int:
    return check_int(
        "keep_snapshots",
        value,
        low=1,
        high=INT64_MAX,
        what="snapshots to keep: the journal needs one to stand on",
    )


def check_no_nul(where: str, value: object) -> None:
    """PostgreSQL's text and jsonb cannot hold a NUL character (U+0000): a payload or
    meta with one is refused before anything is written, not failed mid-batch."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidArgument(
                f"{where} contains a NUL character (\\u0000), which the PostgreSQL journal "
                "cannot store: remove it, or encode the data (base64, say)"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            check_no_nul(where, key)
            check_no_nul(where, item)
    elif isinstance(value, list | tuple):
        for item in value:
            check_no_nul(where, item)
