"""A snapshot document taken in piece by piece: checked, compressed, spooled to a file.

A state document may be hundreds of megabytes. Read whole, a gateway held it four
times over (the body, its text, the JSON parser's copy, the compressed blob): one
250 MiB snapshot took it past 2.5 GiB. Here each piece of the body, as it arrives,
goes through an incremental JSON parser (yajl, through ijson: it checks the text is
one well-formed JSON value in UTF-8 and picks out the top-level ``watermark``) and a
zlib stream into a temporary file; the store then copies that file into its database
a piece at a time. What a body costs in memory is a piece, not the document.

One long string (a file an agent keeps in its memory) would undo that: yajl keeps an
unfinished token and lexes it again from its start with every piece (a 20 MB string
took 10 s, 250 MB would take hours), and ijson builds its value. So the spool follows
whether a piece is inside a string (unescaped quotes, counted in C), and of a piece
wholly inside one it hands the parser only the two ends: the middle is checked here
(UTF-8, no control character, valid escapes) and never parsed.

Synchronous (parser and compressor are C, and the caller runs ``feed`` on a thread):
the event loop only hands pieces over.
"""

from __future__ import annotations

import re
import tempfile
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import ijson  # type: ignore[import-untyped]  # (ships no type hints)

from shadowpod.journal.codec import SNAPSHOT_COMPRESSION_LEVEL
from shadowpod.journal.store import CompressedDocument

_WHITESPACE: Final = b" \t\r\n"
# A backslash and what it escapes (any byte: only pairing matters here).
_ANY_ESCAPE: Final = re.compile(rb"\\.", re.DOTALL)
_VALID_ESCAPE: Final = re.compile(rb'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})')
_CONTROL: Final = bytes(range(0x20))
# Eight printable ASCII bytes without a backslash: a place to cut a string's text
# that splits no escape and no UTF-8 character.
_PLAIN_RUN: Final = re.compile(rb"[\x20-\x5b\x5d-\x7e]{8}")
# How JSON values other than an object begin (anything else is not JSON: the parser says).
_OTHER_VALUES: Final = frozenset(b'["-0123456789tfn')
# The parser is handed at most this much at a time: its events for a piece (a few per
# token) are held until the piece is done.
PARSE_PIECE_BYTES: Final = 64 * 1024
# The events of the top-level ``watermark`` member's value (``prefix`` is the path).
_VALUE_EVENTS: Final = frozenset(
    {"number", "string", "boolean", "null", "start_map", "start_array"}
)


class DocumentRefused(ValueError):
    """The text is not a snapshot document; ``reason`` is the API's reason word."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SnapshotSpool:
    """One document on its way in. ``feed`` each piece, then ``finish``; ``close``
    drops the file (a refused or abandoned upload leaves nothing behind)."""

    def __init__(self, directory: Path | None = None) -> None:
        # Closed by ``close`` (the spool outlives any one block: it is fed by a route).
        self._file = tempfile.TemporaryFile(dir=directory, prefix="shadowpod-snapshot-")  # noqa: SIM115
        self._compressor = zlib.compressobj(SNAPSHOT_COMPRESSION_LEVEL)
        # Events, not values: a value is built only for the top-level watermark — an
        # items() builder would build whatever a document puts there, however large.
        self._events: list[tuple[str, str, Any]] = ijson.sendable_list()
        self._parser = ijson.parse_coro(self._events)
        self._watermarks: list[Any] = []
        self._first: int | None = None  # the document's first non-blank byte
        self._in_string = False  # where the text fed so far ends
        self._escaping = False  # ... right after a backslash
        self.document_bytes = 0
        self._compressed_bytes = 0

    def feed(self, piece: bytes) -> None:
        if not piece:  # an empty piece would tell the parser the text has ended
            return
        if self._first is None:
            stripped = piece.lstrip(_WHITESPACE)
            if stripped:
                self._first = stripped[0]
                if self._first in _OTHER_VALUES:  # refused before it is all read
                    raise _not_an_object(self._first)
        self.document_bytes += len(piece)
        for start in range(0, len(piece), PARSE_PIECE_BYTES):
            part = piece[start : start + PARSE_PIECE_BYTES]
            try:
                self._parser.send(self._parsed_part(part))
            except ijson.JSONError as exc:
                raise _not_json(exc) from None
            self._take_watermarks()
        self._write(self._compressor.compress(piece))

    def finish(self) -> tuple[CompressedDocument, int | None]:
        """The compressed document and the watermark it says it is the state at (0
        when it names none, as a state's default; ``None`` when that is not an
        integer, or when it names one twice)."""
        try:
            self._parser.close()
        except ijson.JSONError as exc:
            raise _not_json(exc) from None
        if self._in_string:  # yajl takes an unfinished string after the value: '{}"'
            raise DocumentRefused(
                "MalformedJSON",
                "the snapshot document is not valid JSON (UTF-8): it ends inside a string",
            )
        self._take_watermarks()
        if self._first != ord("{"):
            raise _not_an_object(self._first)
        self._write(self._compressor.flush())
        self._file.flush()
        document = CompressedDocument(self._file, self._compressed_bytes)
        found = list(self._watermarks)
        if not found:
            return document, 0
        if len(found) > 1 or not _is_int(found[0]):
            return document, None
        return document, int(found[0])

    def close(self) -> None:
        self._file.close()

    def _parsed_part(self, part: bytes) -> bytes:
        """What of ``part`` the parser must see: all of it, or of a part wholly inside
        a string, its two ends (the middle checked here)."""
        escaped_first = self._escaping
        unescaped = _ANY_ESCAPE.sub(b"", part[1:] if escaped_first else part)
        quotes = unescaped.count(b'"')
        inside = self._in_string and quotes == 0 and not escaped_first
        self._in_string ^= bool(quotes & 1)
        self._escaping = unescaped.endswith(b"\\")
        if not inside or len(part) < 64:
            return part
        first = _PLAIN_RUN.search(part)
        last = _PLAIN_RUN.search(part[::-1])
        if first is None or last is None:
            return part
        cut, resume = first.end() - 1, len(part) - last.end() + 7
        if resume <= cut:
            return part
        _check_string_text(part[cut:resume])
        return part[:cut] + part[resume:]

    def _take_watermarks(self) -> None:
        events = self._events
        self._watermarks += [
            value if event != "start_map" and event != "start_array" else None
            for prefix, event, value in events
            if prefix == "watermark" and event in _VALUE_EVENTS
        ]
        events.clear()

    def _write(self, compressed: bytes) -> None:
        if compressed:
            self._file.write(compressed)
            self._compressed_bytes += len(compressed)


def _check_string_text(text: bytes) -> None:
    """``text`` (from inside a string, cut where no escape or character is split) is
    what JSON allows there."""
    try:
        text.decode()
    except UnicodeDecodeError as exc:
        raise DocumentRefused(
            "MalformedJSON", f"the snapshot document is not valid JSON: not UTF-8 ({exc.reason})"
        ) from None
    if len(text.translate(None, _CONTROL)) != len(text):
        raise DocumentRefused(
            "MalformedJSON",
            "the snapshot document is not valid JSON: a control character in a string",
        )
    if b"\\" in _VALID_ESCAPE.sub(b"", text):
        raise DocumentRefused(
            "MalformedJSON", "the snapshot document is not valid JSON: a bad escape in a string"
        )


def _is_int(value: Any) -> bool:
    # ijson gives integers as int and other numbers as Decimal; JSON true is not 1.
    return isinstance(value, int) and not isinstance(value, bool | Decimal)


def _not_json(exc: Exception) -> DocumentRefused:
    said = exc.args[0] if exc.args else ""
    text = said.decode(errors="replace") if isinstance(said, bytes) else str(said)
    detail = text.splitlines()[0] if text.strip() else type(exc).__name__
    return DocumentRefused(
        "MalformedJSON", f"the snapshot document is not valid JSON (UTF-8): {detail}"
    )


def _not_an_object(first: int | None) -> DocumentRefused:
    return DocumentRefused(
        "InvalidRequest",
        f"the snapshot document must be a JSON object (the session state), got {_kind(first)}",
    )


def _kind(first: int | None) -> str:
    if first == ord("["):
        return "array"
    if first == ord('"'):
        return "string"
    if first in (ord("t"), ord("f")):
        return "boolean"
    if first == ord("n"):
        return "null"
    return "number"
