"""Event streams whose clients do not read (their sockets fill up and stay full) slow
neither the session's posts nor its owner's delivery: a commit is handed to a shared
tail, not pushed to each stream. A stalled stream that leaves frees its place; one that
starts reading again gets everything it missed, in order. (How post latency goes with
the number of streams is measured by ``shadowpod bench fanout``, not here.)"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from urllib.parse import urlsplit

import orjson

from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import CONTROL, SESSION, StartGateway

STALLED = 40
POSTS = 80
CONTENT = "x" * 60_000  # 80 posts: ~5 MB each stalled stream never reads


async def stalled_stream(
    url: str, session: str = SESSION
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An SSE request whose answer is not read past its head (until the test reads
    it), on a small receive buffer (so the gateway's side fills up soon)."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (parts.hostname, parts.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    request = f"GET /v1/sessions/{session}/events/stream HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n"
    writer.write(request.encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"chunked" in head.lower(), head
    return reader, writer


async def streamed_messages(reader: asyncio.StreamReader) -> AsyncIterator[str]:
    """The ids of the messages a raw (chunked) SSE answer carries, in order."""
    pending = b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        pending += (await reader.readexactly(size + 2))[:-2]
        *events, pending = pending.split(b"\r\n\r\n")
        for event in events:
            for line in event.split(b"\r\n"):
                if line.startswith(b"data: "):
                    for entry in orjson.loads(line[len(b"data: ") :]):
                        if entry["kind"] == "message":
                            yield entry["id"]


async def test_stalled_streams_slow_neither_posts_nor_the_owner(
    start_gateway: StartGateway,
) -> None:
    gateway = await start_gateway(max_streams_per_session=STALLED + 1)
    async with GatewayClient(gateway.url, CONTROL) as control:
        created = await control.create_session(CreateSession(session=SESSION))
        await control.set_ownership(SESSION, OwnershipChange(expect_epoch=0, epoch=1, owner="a"))
    stalled = [(await stalled_stream(gateway.url))[1] for _ in range(STALLED)]
    assert gateway.gw.event_streams[SESSION] == STALLED

    async with (
        GatewayClient(gateway.url, timeout_s=30) as client,
        GatewayClient(gateway.url, created.agent_token, timeout_s=30) as owner,
    ):
        delivered: list[str] = []

        async def deliver() -> None:
            after = 0
            while len(delivered) < POSTS:
                entries, _ = await owner.owner_entries(SESSION, epoch=1, after=after, wait_s=5)
                delivered.extend(str(e.id) for e in entries if e.kind == "message")
                after = entries[-1].seq if entries else after

        streamed: list[str] = []

        async def stream() -> None:
            async with aclosing(client.event_stream(SESSION)) as batches:
                async for batch in batches:
                    streamed.extend(str(e.id) for e in batch if e.kind == "message")
                    if len(streamed) == POSTS:
                        return

        readers = asyncio.gather(deliver(), stream())
        posted = [
            (await client.post_message(SESSION, CONTENT, id=f"m{n}")).id for n in range(POSTS)
        ]
        await asyncio.wait_for(readers, 60)
    assert delivered == streamed == posted == [f"m{n}" for n in range(POSTS)]

    for writer in stalled:  # leaving frees the places of streams stuck in a full socket
        writer.transport.abort()
    for _ in range(100):
        if not gateway.gw.event_streams[SESSION]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{gateway.gw.event_streams[SESSION]} stalled streams still open")


async def test_a_stream_that_stalled_gets_everything_in_order_once_it_reads(
    start_gateway: StartGateway,
) -> None:
    gateway = await start_gateway()
    async with GatewayClient(gateway.url, CONTROL) as control:
        await control.create_session(CreateSession(session=SESSION))
    reader, writer = await stalled_stream(gateway.url)
    try:
        async with GatewayClient(gateway.url, timeout_s=30) as client:
            # ~5 MB the stalled client does not read: far more than its socket holds.
            for n in range(POSTS):
                await client.post_message(SESSION, CONTENT, id=f"m{n}")
            assert gateway.gw.event_streams[SESSION] == 1  # still open, not dropped
            messages = aclosing(streamed_messages(reader))
            async with messages as ids:
                received = [await asyncio.wait_for(anext(ids), 30) for _ in range(POSTS)]
                assert received == [f"m{n}" for n in range(POSTS)]
                # Caught up, it is live again: the next commit comes as it is made.
                await client.post_message(SESSION, "and then", id="after")
                assert await asyncio.wait_for(anext(ids), 30) == "after"
    finally:
        writer.transport.abort()


async def test_a_session_created_again_under_its_name_streams_its_own_entries(
    start_gateway: StartGateway,
) -> None:
    """Streams share each commit's encoding: a deleted session's must not be sent as
    the entries of the session created next under its name, at the same seqs."""
    gateway = await start_gateway()
    async with (
        GatewayClient(gateway.url, CONTROL) as control,
        GatewayClient(gateway.url, timeout_s=30) as client,
    ):
        for life in ("first", "second"):
            await control.create_session(CreateSession(session=SESSION))
            await client.post_message(SESSION, life, id=life)
            async with aclosing(client.event_stream(SESSION)) as batches:
                batch = await asyncio.wait_for(anext(batches), 30)
            assert [(e.id, e.payload["content"]) for e in batch if e.kind == "message"] == [
                (life, life)
            ]
            await control.delete_session(SESSION)
