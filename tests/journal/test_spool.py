"""The snapshot spool: a document checked and compressed piece by piece."""

from __future__ import annotations

import zlib

import pytest

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
