"""How entries and snapshots are laid out in a database row (shared by both backends)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

from shadowpod.domain.entries import JournalEntry

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)
SNAPSHOT_COMPRESSION_LEVEL: Final = 6


def now_us() -> int:
    """Wall-clock time in integer microseconds since the Unix epoch (UTC)."""
    return to_us(datetime.now(UTC))


def to_us(ts: datetime) -> int:
    return (ts - _EPOCH) // _US


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    return orjson.dumps(payload)


def decode_payload(raw: bytes | str) -> dict[str, Any]:
    value = orjson.loads(raw)
    assert isinstance(value, dict)
    return value


def entry_from_row(
    seq: int, entry_id: str, kind: str, epoch: int, ts_us: int, payload: bytes | str
) -> JournalEntry:
    # Rows were validated when appended; no validation here keeps replay fast.
    return JournalEntry(seq, entry_id, kind, epoch, from_us(ts_us), decode_payload(payload))


def entries_json(entries: Sequence[JournalEntry]) -> bytes:
    """Entries as a JSON array (orjson encodes the dataclasses field by field)."""
    return orjson.dumps(entries, option=orjson.OPT_UTC_Z)


def compress_document(document: Mapping[str, Any]) -> bytes:
    return zlib.compress(orjson.dumps(document), SNAPSHOT_COMPRESSION_LEVEL)


def decompress_document(blob: bytes) -> dict[str, Any]:
    return decode_payload(zlib.decompress(blob))
