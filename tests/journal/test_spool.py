"""The snapshot spool: a document checked and compressed piece by piece."""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowpod.journal import spool as spool_module
from shadowpod.journal.spool import DocumentRefused, SnapshotSpool


def _spooled(document: bytes, piece: int = 3) -> int | None:
    spool = SnapshotSpool()
    try:
        for start in range(0, len(document), piece):
            spool.feed(document[start : start + piece])
        compressed, watermark = spool.finish()
        stored = b"".join(compressed.pieces())
        assert zlib.decompress(stored) == document  # what a store keeps (codec)
        return watermark
    finally:
        spool.close()


@pytest.mark.parametrize(
    ("document", "watermark"),
    [
        pytest.param(b'{"watermark": 5, "a": {"watermark": 7}}', 5, id="top-level-only"),
        pytest.param(b'{"a": 1}  \n', 0, id="none-is-0"),
        pytest.param(b'{"watermark": 5.0}', None, id="float"),
        pytest.param(b'{"watermark": 5e0}', None, id="exponent"),
        pytest.param(b'{"watermark": true}', None, id="boolean"),
        pytest.param(b'{"watermark": "5"}', None, id="string"),
        pytest.param(b'{"watermark": {"seq": 5}}', None, id="object"),
        pytest.param(b'{"watermark": 1, "watermark": 2}', None, id="twice"),
    ],
)
def test_the_watermark_a_document_says_it_is_at(document: bytes, watermark: int | None) -> None:
    assert _spooled(document) == watermark


@pytest.mark.parametrize(
    ("document", "reason", "says"),
    [
        pytest.param(b'{"a": ', "MalformedJSON", "premature EOF", id="cut-short"),
        pytest.param(b'{"a": 1} {}', "MalformedJSON", "trailing garbage", id="two-values"),
        # yajl itself takes this one (found by the damaged-object property below).
        pytest.param(b'{"": []}"', "MalformedJSON", "ends inside a string", id="open-string"),
        pytest.param(b'{"a": "\xff"}', "MalformedJSON", "UTF8", id="not-utf8"),
        pytest.param(b'{"a": NaN}', "MalformedJSON", "invalid char", id="nan"),
        pytest.param(b"", "MalformedJSON", "premature EOF", id="empty"),
        pytest.param(b"[1, 2]", "InvalidRequest", "got array", id="array"),
        pytest.param(b'  "x"', "InvalidRequest", "got string", id="string"),
    ],
)
def test_a_document_that_is_not_a_json_object_is_refused(
    document: bytes, reason: str, says: str
) -> None:
    with pytest.raises(DocumentRefused, match=says) as refused:
        _spooled(document)
    assert refused.value.reason == reason


# Strings long enough to be cut (the parser sees a piece's ends), with what JSON must
# escape in them: quotes, backslashes, control characters, non-ASCII.
TEXT = st.text(alphabet=st.sampled_from('ab cd"\\/\n\t\x01é€😀'), max_size=300)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def _json_object(text: bytes) -> bool:
    """Whether Python's strict parser reads ``text`` as one JSON object."""

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        value = json.loads(text.decode("utf-8"), parse_constant=refuse)
    except ValueError:
        return False
    return isinstance(value, dict)


def _taken(text: bytes, cuts: list[int]) -> bool:
    """Whether the spool takes ``text`` fed in pieces cut at ``cuts``, parsing 64 bytes
    at a time: strings are cut (their middles checked by the spool, not the parser) at
    every length hypothesis makes."""
    spool = SnapshotSpool()
    try:
        start = 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(spool_module, "PARSE_PIECE_BYTES", 64)
            for cut in [*sorted(c % (len(text) + 1) for c in cuts), len(text)]:
                spool.feed(text[start:cut])
                start = cut
            spool.finish()
    except DocumentRefused:
        return False
    finally:
        spool.close()
    return True


@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(TEXT, JSON_VALUES, max_size=5),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
    ascii_only=st.booleans(),
)
def test_any_json_object_cut_anywhere_is_taken(
    value: dict[str, object], cuts: list[int], ascii_only: bool
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert _taken(text, cuts)


@settings(max_examples=600, deadline=None)
@given(
    value=st.dictionaries(TEXT, JSON_VALUES, min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0), max_size=4),
    at=st.integers(min_value=0),
    byte=st.sampled_from(list(b'{}[],:"\\ -.019eEtfnu\t\n\x00\x01\xff\xc3\xa9\xe2')),
    delete=st.booleans(),
)
def test_a_damaged_object_is_refused_exactly_when_json_refuses_it(
    value: dict[str, object], cuts: list[int], at: int, byte: int, delete: bool
) -> None:
    text = json.dumps(value, ensure_ascii=False).encode()
    at %= len(text) + 1
    damaged = text[:at] + (b"" if delete else bytes([byte])) + text[at + delete :]
    assert _taken(damaged, cuts) == _json_object(damaged)


def test_one_long_string_costs_a_piece_not_the_string() -> None:
    """A 32 MB string fed in 64 KiB pieces: the parser never sees more than a piece's
    ends of it (it lexed an unfinished token again with every piece: minutes)."""
    spool = SnapshotSpool()
    seen: list[int] = []
    parsed_part = spool._parsed_part

    def recording(part: bytes) -> bytes:
        given_to_parser = parsed_part(part)
        seen.append(len(given_to_parser))
        return given_to_parser

    spool._parsed_part = recording  # type: ignore[method-assign]
    text = b"ab\\n c\\u00e9d " * 2_500_000
    try:
        spool.feed(b'{"watermark": 7, "file": "')
        for start in range(0, len(text), 256 * 1024):
            spool.feed(text[start : start + 256 * 1024])
        spool.feed(b'"}')
        assert spool.finish()[1] == 7
    finally:
        spool.close()
    assert sum(seen) < len(text) / 100
