"""How entries and snapshots are laid out in a database row (shared by both backends),
and how a stored state document is read back."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.errors import StateDocumentInvalid
from shadowpod.domain.schema import load_state
from shadowpod.domain.state import SessionState

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)
# zlib's fastest level: a state document compresses about 10:1 at level 1 against
# 12:1 at level 6, for less than half the CPU — and snapshots are written far more
# often than they are read.
SNAPSHOT_COMPRESSION_LEVEL: Final = 1
# An entry's payload of at least this many bytes of JSON is stored compressed (at the
# snapshots' level): a framework agent's state entries are a few KB each and compress
# about 3:1, while the messages, acks and markers that make up most of a journal are
# far below it and are stored as they are (compressing them would gain a few bytes for
# the CPU).
PAYLOAD_COMPRESSED_FROM: Final = 1024
# The first byte of a payload stored compressed, before its zlib stream. A payload
# stored as it is is a JSON object, so it starts with "{" — all that builds before
# this one wrote, and they still read as they are.
COMPRESSED_PAYLOAD_MARK: Final = b"\x00"


def now_us() -> int:
    """Wall-clock time in integer microseconds since the Unix epoch (UTC)."""
    return to_us(datetime.now(UTC))


def to_us(ts: datetime) -> int:
    return (ts - _EPOCH) // _US


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    return orjson.dumps(payload)


def stored_payload(payload: Mapping[str, Any]) -> bytes:
    """An entry's payload as its row stores it: its JSON, compressed when it is large
    and that makes it smaller (``PAYLOAD_COMPRESSED_FROM``); ``payload_json`` reads it
    back. Compressed where the row is written (for SQLite, in the writer's batch on the
    event loop): ~20 µs for a 3.7 KB state entry; a request's largest body (1 MiB by
    default) a few milliseconds, as parsing it costs already."""
    text = orjson.dumps(payload)
    if len(text) < PAYLOAD_COMPRESSED_FROM:
        return text
    # A window as large as the payload (up to zlib's 32 KiB) and a 64 KiB hash at most,
    # not zlib's default buffers: allocated and cleared for every call, they made a 3.7
    # KB state entry take ~450 µs (median, the loaded 2-core machine) against ~20 µs,
    # and a 19 KB one ~680 against ~115 µs, for the same bytes out (``zlib.decompress``
    # reads any window).
    window = min(15, max(9, (len(text) - 1).bit_length()))
    deflate = zlib.compressobj(
        SNAPSHOT_COMPRESSION_LEVEL, zlib.DEFLATED, window, min(6, window - 6)
    )
    packed = COMPRESSED_PAYLOAD_MARK + deflate.compress(text) + deflate.flush()
    return packed if len(packed) < len(text) else text


def payload_json(stored: bytes | str) -> bytes | str:
    """The JSON text of a payload as a row stores it (``stored_payload``; a row written
    by an older build is its JSON text)."""
    if isinstance(stored, bytes) and stored[:1] == COMPRESSED_PAYLOAD_MARK:
        return zlib.decompress(memoryview(stored)[1:])
    return stored


def payload_text(stored: bytes | str) -> str:
    """``payload_json`` as a string: the SQLite function the journal's SQL reads a
    stored payload with (``sqlite/sql.py``)."""
    text = payload_json(stored)
    return text if isinstance(text, str) else text.decode()


def decode_payload(raw: bytes | str) -> dict[str, Any]:
    value = orjson.loads(payload_json(raw))
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


def compress_document(document_json: bytes) -> bytes:
    """A snapshot document as stored (zlib releases the GIL while it works)."""
    return zlib.compress(document_json, SNAPSHOT_COMPRESSION_LEVEL)


def decompress_document(blob: bytes) -> bytes:
    return zlib.decompress(blob)


def json_type(text: bytes) -> str | None:
    """The type of the JSON value ``text`` holds (``object``, ``array``, ...), or
    ``None`` when it is not JSON in UTF-8 (see ``json_shape``)."""
    return json_shape(text)[0]


def json_shape(text: bytes) -> tuple[str | None, int | None]:
    """``json_type`` of ``text``, and for an object the integer of its top-level
    ``watermark`` member (0 when it has none, as a state's default; ``None`` when it is
    not an integer): a snapshot document says which watermark it is the state at, and
    the gateway checks that against the URL.

    Checked by SQLite's JSON parser, which is C and releases the GIL: a multi-megabyte
    snapshot document is checked on a thread while the event loop goes on serving,
    where a Python parser would hold the GIL for tens of milliseconds building objects
    only to throw them away.
    """
    try:
        decoded = text.decode()
    except UnicodeDecodeError:
        return None, None
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        row = conn.execute(
            "SELECT CASE WHEN json_valid(?1) THEN json_type(?1) END,"
            " CASE WHEN json_valid(?1) AND json_type(?1) = 'object' THEN"
            " CASE WHEN json_type(?1, '$.watermark') IS NULL THEN 0"
            " WHEN json_type(?1, '$.watermark') = 'integer' THEN json_extract(?1, '$.watermark')"
            " END END",
            (decoded,),
        ).fetchone()
    kind: str | None = row[0]
    watermark: int | None = row[1]
    return kind, watermark


def load_state_json(document_json: bytes | str) -> SessionState:
    """``load_state`` of a stored state document still in its JSON text (the schema
    version it was written in is its own ``schema_version`` field).

    The text is parsed by orjson and the objects validated. Validating straight from
    the text (``model_validate_json``) was a quarter of orjson's speed on the agent's
    own values, which pydantic's parser builds value by value and which are most of a
    framework agent's state (a LangGraph agent's checkpoints): a shadow spends this
    before it can start catching up. Those values are JSON once parsed, so they are
    not walked again (``Json``). A document orjson does not read (an integer beyond
    64 bits) is parsed by the standard library.
    """
    try:
        document = orjson.loads(document_json)
    except orjson.JSONDecodeError:
        document = json.loads(document_json)
    if not isinstance(document, dict):
        raise StateDocumentInvalid(
            f"not a Shadowpod session state: the document is a JSON {type(document).__name__}, "
            "expected an object"
        )
    return load_state(document)
