"""A request the gateway cannot parse (a header line over the limit) is answered
400 in the JSON error shape, and no part of its headers — a token in them above all —
reaches the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.gateway.conftest import RunningGateway

SECRET = "s3cr3t-token-never-logged"


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(f"Authorization: Bearer {SECRET}{'x' * 9000}", id="long-authorization"),
        pytest.param(f"X-Other: {SECRET}{'y' * 9000}", id="long-other-header"),
    ],
)
async def test_a_header_line_too_long_is_a_json_400_and_its_bytes_are_not_logged(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture, header: str
) -> None:
    caplog.set_level(logging.DEBUG)
    host, port = gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /v1/sessions/s HTTP/1.1\r\nHost: x\r\n{header}\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b" 400 " in head.split(b"\r\n")[0], head
    assert b'"reason": "BadRequest"' in body or b'"reason":"BadRequest"' in body, body
    assert SECRET.encode() not in answer
    logged = "\n".join(
        record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
        for record in caplog.records
    )
    assert SECRET not in logged
