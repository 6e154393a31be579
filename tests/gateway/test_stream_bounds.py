"""Event streams are bounded per session and in all: one more is a 503
``TooManyStreams`` with ``Retry-After``, and a stream that ends frees its place."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
import pytest

from shadowpod.api.models import CreateSession
from shadowpod.client.gateway import GatewayClient
from shadowpod.gateway import streams
from tests.gateway.conftest import CONTROL, StartGateway, call


async def open_events(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    response = await http.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
    assert response.status == 200, await response.text()
    return response


async def test_streams_are_bounded_per_session_and_in_all(
    start_gateway: StartGateway, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream learns its client left when its ping fails (nothing is committed to
    # its session here): pinged often, it frees its place within the test's wait.
    monkeypatch.setattr(streams, "PING_S", 0.2)
    gateway = await start_gateway(max_streams=3, max_streams_per_session=2)
    async with GatewayClient(gateway.url, CONTROL) as control:
        for name in ("a", "b", "c"):
            await control.create_session(CreateSession(session=name))
    events = f"{gateway.url}/v1/sessions/{{}}/events/stream"
    async with AsyncExitStack() as held:
        for name in ("a", "a"):
            held.push_async_callback((await open_events(http, events.format(name))).release)
        third = await call(http, "GET", events.format("a"))
        assert (third.status, third.reason) == (503, "TooManyStreams"), third.text
        assert "session 'a'" in third.json["message"]
        assert int(third.headers["Retry-After"]) > 0
        held.push_async_callback((await open_events(http, events.format("b"))).release)
        over_all = await call(http, "GET", events.format("c"))
        assert (over_all.status, over_all.reason) == (503, "TooManyStreams")
        # Posting still works meanwhile.
        posted = await call(
            http, "POST", f"{gateway.url}/v1/sessions/c/messages", json={"content": "hi"}
        )
        assert posted.status == 202
    for _ in range(50):  # the closed streams free their places
        again = await http.get(events.format("c"))
        if again.status == 200:
            again.close()
            return
        again.close()
        await asyncio.sleep(0.1)
    raise AssertionError("closed streams did not free their places")


async def test_a_client_that_leaves_an_idle_stream_frees_its_place(
    start_gateway: StartGateway, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is committed after the client leaves: the stream used to notice only at
    the session's next commit, and kept its place (a session without traffic could be
    closed to streams by clients that came and went). The ping notices."""
    monkeypatch.setattr(streams, "PING_S", 0.2)
    gateway = await start_gateway(max_streams_per_session=1)
    async with GatewayClient(gateway.url, CONTROL) as control:
        await control.create_session(CreateSession(session="a"))
    events = f"{gateway.url}/v1/sessions/a/events/stream"
    (await open_events(http, events)).close()  # the client leaves
    for _ in range(100):
        if not gateway.gw.event_streams["a"]:
            break
        await asyncio.sleep(0.05)
    assert not gateway.gw.event_streams["a"], "the stream of a client that left is still open"
    (await open_events(http, events)).close()  # its place is free
