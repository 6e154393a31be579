"""Edges an attacker (or a buggy client) reaches: bodies larger than a route takes,
requests aiohttp cannot parse, slow clients, out-of-range and odd values. Each is a JSON
4xx naming what is wrong, and the gateway keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson
import pytest

from shadowpod.api.models import CreateSession
from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import CONTROL, Reply, Session, StartGateway, call
from tests.gateway.test_bad_requests import assert_error, assert_still_serving

TOO_BIG = str(2**64)


# --- raw HTTP: what aiohttp's client would not send -----------------------------------


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def read_answer(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> Reply:
    """One HTTP/1.1 answer with a Content-Length body, read off a raw connection."""
    async with asyncio.timeout(timeout_s):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().title()] = value.strip()
        body = await reader.readexactly(int(headers.get("Content-Length", "0")))
    return Reply(status, headers, body.decode())


def request_head(method: str, path: str, *, token: str | None = None, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def send_chunked_forever(writer: asyncio.StreamWriter, chunk: int, total: int) -> None:
    """Chunks of a body that never ends (no last chunk), ``total`` bytes of them."""
    piece = f"{chunk:x}\r\n".encode() + b"x" * chunk + b"\r\n"
    with contextlib.suppress(ConnectionError):
        for _ in range(total // chunk):
            writer.write(piece)
            await writer.drain()


# --- 1. bodies: refused as soon as the route's own limit is crossed --------------------


@pytest.mark.parametrize(
    ("route", "token_of", "limit"),
    [
        pytest.param("/v1/sessions/s/messages", "none", 2048, id="client-message"),
        pytest.param("/v1/sessions/s/ownership", "control", 2048, id="control-body"),
        pytest.param("/v1/sessions/s/acks", "agent", 2048, id="ack"),
    ],
)
async def test_a_streamed_body_is_refused_once_past_the_routes_limit(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    route: str,
    token_of: str,
    limit: int,
) -> None:
    """The snapshot limit (64 MiB here) is not the limit of other routes: a chunked
    body is answered 413 once it passes the route's limit, while it is still coming."""
    gateway = await start_gateway(max_body_bytes=limit, max_snapshot_bytes=64 * 1024 * 1024)
    async with GatewayClient(gateway.url, CONTROL) as control:
        agent_token = (await control.create_session(CreateSession(session="s"))).agent_token
    token = {"none": None, "control": CONTROL, "agent": agent_token}[token_of]
    method = "PUT" if route.endswith("ownership") else "POST"
    reader, writer = await connect(gateway.url)
    writer.write(
        request_head(
            method,
            route,
            token=token,
            Content_Type="application/json",
            Transfer_Encoding="chunked",
        )
    )
    sending = asyncio.create_task(send_chunked_forever(writer, 1024, 1024 * 1024))
    try:
        answer = await read_answer(reader)
    finally:
        sending.cancel()
        writer.close()
    assert_error(answer, 413, "TooLarge")
    assert f"{limit} bytes" in answer.json["message"]
    await assert_still_serving(http, gateway.url, "s")


async def test_a_declared_length_over_the_limit_is_refused_before_authentication(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(max_body_bytes=2048)
    reader, writer = await connect(gateway.url)
    # No token at all: the size is refused first, and no byte of the body is needed.
    writer.write(request_head("POST", "/v1/sessions", Content_Length=str(10**9)))
    answer = await read_answer(reader)
    writer.close()
    assert_error(answer, 413, "TooLarge")


async def test_control_bodies_have_a_small_limit_of_their_own(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(max_body_bytes=1024 * 1024)
    async with GatewayClient(gateway.url, CONTROL) as control:
        await control.create_session(CreateSession(session="s"))
    reply = await call(
        http,
        "PUT",
        f"{gateway.url}/v1/sessions/s/ownership",
        token=CONTROL,
        json={"expect_epoch": 0, "epoch": 1, "owner": "x" * 100_000},
    )
    assert_error(reply, 413, "TooLarge")
    assert "16384 bytes" in reply.json["message"]


async def test_a_body_that_pauses_too_long_is_408(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(body_idle_timeout_s=0.3)
    async with GatewayClient(gateway.url, CONTROL) as control:
        await control.create_session(CreateSession(session="s"))
    reader, writer = await connect(gateway.url)
    writer.write(
        request_head("POST", "/v1/sessions/s/messages", Content_Length="100") + b'{"content": '
    )
    answer = await read_answer(reader)
    writer.close()
    assert_error(answer, 408, "BodyTimeout")
    await assert_still_serving(http, gateway.url, "s")


# --- 2. what aiohttp answers itself is JSON too ----------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: g\r\nNo colon here\r\n\r\n", id="header"),
        pytest.param(b"GET /healthz HTTP/9.9\r\nHost: g\r\n\r\n", id="version"),
        pytest.param(b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", id="line-too-long"),
        pytest.param(
            b"POST /v1/sessions HTTP/1.1\r\nHost: g\r\nContent-Length: x\r\n\r\n", id="length"
        ),
    ],
)
async def test_requests_aiohttp_cannot_parse_get_the_json_error_body(
    url: str, http: aiohttp.ClientSession, session: Session, raw: bytes
) -> None:
    reader, writer = await connect(url)
    writer.write(raw)
    answer = await read_answer(reader)
    writer.close()
    assert 400 <= answer.status < 500, answer.text
    assert answer.headers["Content-Type"].startswith("application/json")
    assert set(answer.json) == {"reason", "message", "errors"}
    assert answer.json["message"]
    await assert_still_serving(http, url, session.name)


async def test_405_names_the_allowed_methods(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    reply = await call(http, "PATCH", f"{url}/v1/sessions/{session.name}/ownership")
    assert_error(reply, 405, "MethodNotAllowed")
    assert set(reply.headers["Allow"].split(",")) == {"GET", "HEAD", "PUT"}
    assert "GET" in reply.json["message"]


# --- 3. accepted nonsense --------------------------------------------------------------


async def test_an_ack_beyond_the_head_is_refused_naming_turn(
    http: aiohttp.ClientSession, url: str, owned: Session
) -> None:
    await call(http, "POST", f"{url}/v1/sessions/{owned.name}/messages", json={"content": "hi"})
    reply = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/acks",
        token=owned.agent_token,
        json={"epoch": 1, "turn": 99},
    )
    assert_error(reply, 409, "InvalidTurn")
    assert reply.locs == ["turn"]
    status = await call(http, "GET", f"{url}/v1/sessions/{owned.name}")
    assert status.json["acked"] == 0  # nothing reported as acked


@pytest.mark.parametrize(
    ("body", "status"),
    [(None, 202), (b"", 202), (b"{}", 202), (b'{"watermark": 3}', 400), (b"[1]", 400)],
)
async def test_a_snapshot_request_reads_its_body(
    http: aiohttp.ClientSession, url: str, session: Session, body: bytes | None, status: int
) -> None:
    reply = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{session.name}/snapshot-requests",
        token=CONTROL,
        data=body,
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == status, reply.text
    if status == 400:
        assert_error(reply, 400, "InvalidRequest")
        if body and body.startswith(b"{"):
            assert reply.locs == ["watermark"]


# --- 4. out-of-range and odd values: a 400 naming the field ----------------------------

QUERY_CASES = [
    ("events", "after", TOO_BIG),
    ("events", "after", "\u0661\u0662"),  # Arabic-Indic digits: int() would take them
    ("events", "after", "\u00b2"),  # a superscript: isdigit() but not int()
    ("events", "after", "1_000"),
    ("events", "after", " 5"),
    ("events", "after", "-1"),
    ("events", "limit", TOO_BIG),
    ("events", "wait", "nan"),
    ("events", "wait", "1e3"),
    ("events", "wait", "\u0661"),
    ("journal", "after", TOO_BIG),
    ("owner/entries?epoch=1&x", "released", TOO_BIG),
]


@pytest.mark.parametrize(("route", "name", "value"), QUERY_CASES)
async def test_odd_query_values_are_400_naming_the_parameter(
    http: aiohttp.ClientSession, url: str, owned: Session, route: str, name: str, value: str
) -> None:
    path, _, fixed = route.partition("?")
    params = dict(p.split("=") for p in fixed.split("&") if "=" in p)
    params[name] = value
    reply = await call(
        http,
        "GET",
        f"{url}/v1/sessions/{owned.name}/{path}",
        token=owned.agent_token,
        params=params,
    )
    assert_error(reply, 400, "InvalidQuery")
    assert reply.locs == [name]


@pytest.mark.parametrize("value", ["\u00b2", "\u0661", TOO_BIG, "abc"])
async def test_odd_resume_points_and_watermarks_are_400(
    http: aiohttp.ClientSession, url: str, owned: Session, value: str
) -> None:
    stream = await call(
        http,
        "GET",
        f"{url}/v1/sessions/{owned.name}/events/stream",
        headers={"Last-Event-ID": value},
    )
    assert_error(stream, 400, "InvalidQuery")
    assert stream.locs == ["Last-Event-ID"]
    snapshot = await call(
        http, "GET", f"{url}/v1/sessions/{owned.name}/snapshots/{value}", token=owned.agent_token
    )
    assert_error(snapshot, 400, "InvalidRequest")
    assert snapshot.locs == ["watermark"]


ODD: list[Any] = [2**63, 2**64, -1, True, "7", 1.5, None]
BODY_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("POST", "journal", {"epoch": 1, "entries": []}, "epoch"),
    ("POST", "journal", {"epoch": 1, "entries": [], "after": 0}, "after"),
    ("POST", "acks", {"epoch": 1, "turn": 1}, "epoch"),
    ("POST", "acks", {"epoch": 1, "turn": 1}, "turn"),
    ("PUT", "ownership", {"expect_epoch": 1, "epoch": 2, "owner": "b"}, "expect_epoch"),
    ("PUT", "ownership", {"expect_epoch": 1, "epoch": 2, "owner": "b"}, "epoch"),
    ("POST", "fence", {"expect_epoch": 1, "new_owner": "b"}, "expect_epoch"),
    ("POST", "unfence", {"expect_epoch": 1}, "expect_epoch"),
    ("POST", "drained", {"instance": "a", "epoch": 1}, "epoch"),
]


@pytest.mark.parametrize(
    ("method", "route", "body", "field", "value"),
    [
        pytest.param(*case, value, id=f"{case[1]}.{case[3]}={value!r}")
        for case in BODY_CASES
        for value in ODD
        if not (value is None and case[3] == "after")  # after may be null
    ],
)
async def test_odd_integers_in_bodies_are_400_naming_the_field(
    http: aiohttp.ClientSession,
    url: str,
    owned: Session,
    method: str,
    route: str,
    body: dict[str, Any],
    field: str,
    value: Any,
) -> None:
    token = CONTROL if route in ("ownership", "fence", "unfence") else owned.agent_token
    raw = orjson.dumps({**body, field: 0}).replace(b":0", b":" + _json(value), 1)
    reply = await call(
        http,
        method,
        f"{url}/v1/sessions/{owned.name}/{route}",
        token=token,
        data=raw,
        headers={"Content-Type": "application/json"},
    )
    assert_error(reply, 400, "InvalidRequest")
    assert reply.locs == [field], reply.text


def _json(value: Any) -> bytes:
    return (
        str(value).encode()
        if isinstance(value, int) and not isinstance(value, bool)
        else (orjson.dumps(value))
    )


@pytest.mark.parametrize(
    ("process", "loc"),
    [
        ({"name": "", "outcome": "exited"}, "processes.0.name"),
        ({"name": "x", "outcome": "exited", "pid": 2**40}, "processes.0.pid"),
        ({"name": "x", "outcome": "exited", "exit_code": 2**40}, "processes.0.exit_code"),
    ],
)
async def test_a_drain_report_is_held_to_the_bounds_of_its_entries(
    http: aiohttp.ClientSession, url: str, owned: Session, process: dict[str, Any], loc: str
) -> None:
    reply = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/drained",
        token=owned.agent_token,
        json={"instance": "pod-a", "epoch": 1, "processes": [process]},
    )
    assert_error(reply, 400, "InvalidRequest")
    assert reply.locs == [loc]


# --- 5. slow clients -------------------------------------------------------------------


async def test_one_address_holds_a_bounded_number_of_connections(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(max_connections_per_peer=4, header_timeout_s=1.0)
    async with GatewayClient(gateway.url, CONTROL) as control:
        await control.create_session(CreateSession(session="s"))
    await asyncio.sleep(0.1)  # the client's connection is closed
    held = [await connect(gateway.url) for _ in range(4)]
    for _, writer in held:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: g\r\n")  # and never the blank line
    refused_reader, refused_writer = await connect(gateway.url)
    refused = await read_answer(refused_reader)
    refused_writer.close()
    assert_error(refused, 503, "TooManyConnections")
    # The trickling connections are closed once their headers are overdue ...
    for reader, writer in held:
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
    # ... and the address is served again.
    await assert_still_serving(http, gateway.url, "s")


async def test_headers_trickled_slower_than_the_header_timeout_are_cut_off(
    start_gateway: StartGateway,
) -> None:
    gateway = await start_gateway(header_timeout_s=0.5)
    reader, writer = await connect(gateway.url)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with contextlib.suppress(ConnectionError):
        for _ in range(50):  # a header byte every 0.1 s: 5 s if nothing stopped it
            writer.write(b"X")
            await writer.drain()
            await asyncio.sleep(0.1)
            if reader.at_eof() or writer.is_closing():
                break
        async with asyncio.timeout(5):
            await reader.read()
    assert loop.time() - started < 3.0
    writer.close()
