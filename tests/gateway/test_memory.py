"""Memory under attack: a real ``shadowpod gateway`` process is sent, all at once,
oversized and trickled bodies on every route, without a token and with the right
one. Its peak RSS stays under a stated bound and it keeps serving another session
meanwhile.

The bound: the gateway's resting size plus ``HEADROOM`` — what the few bodies it
must hold at once (each at most its route's limit) and the connections cost. Before
bodies were streamed with per-route limits, each of these uploads was read up to the
snapshot limit (32 MiB here): the same attack took the gateway past a gigabyte.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import aiohttp
import pytest

from tests.gateway.conftest import CONTROL
from tests.gateway.test_openapi import SPEC, operations

MIB: Final = 1024 * 1024
SNAPSHOT_LIMIT: Final = 32 * MIB
BODY_LIMIT: Final = 1 * MIB
SENT_PER_UPLOAD: Final = 40 * MIB  # more than any limit: every upload must be cut off
# Above the resting RSS: the authenticated snapshot uploads may each be held whole
# (8 of them at 32 MiB would be 256 MiB); everything else is refused within 1 MiB.
HEADROOM: Final = 160 * MIB
SNAPSHOT_UPLOADS: Final = 2
IDLE_S: Final = 1.5  # the gateway's body_idle_timeout_s: a trickle that stops is 408
TAKES_BODY: Final = {op["operationId"] for _, _, op in operations(SPEC) if "requestBody" in op}


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[tuple[str, int]]:
    tokens = tmp_path / "control.tokens"
    tokens.write_text(CONTROL + "\n")
    port = free_port()
    log = (tmp_path / "gateway.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shadowpod",
            "gateway",
            "--journal",
            f"sqlite:///{tmp_path / 'j.db'}",
            "--port",
            str(port),
            "--control-token-file",
            str(tokens),
            "--max-body-bytes",
            str(BODY_LIMIT),
            "--max-snapshot-bytes",
            str(SNAPSHOT_LIMIT),
            "--body-idle-timeout",
            str(IDLE_S),
            "--log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            break
        assert process.poll() is None, (tmp_path / "gateway.log").read_text()
        time.sleep(0.05)
    try:
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def upload(
    port: int, method: str, path: str, token: str | None, *, total: int, pause_s: float
) -> tuple[int, str]:
    """A chunked body of up to ``total`` bytes (with ``pause_s`` between chunks), until
    the gateway answers; its status (0 when it closed without one) and what it said."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [f"{method} {path} HTTP/1.1", "Host: g", "Transfer-Encoding: chunked"]
    head.append("Content-Type: application/json")
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    chunk = 64 * 1024 if pause_s == 0 else 1
    piece = f"{chunk:x}\r\n".encode() + b" " * chunk + b"\r\n"

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(total // chunk):
                writer.write(piece)
                await writer.drain()
                if pause_s:
                    await asyncio.sleep(pause_s)

    sending = asyncio.create_task(send())
    said = b""
    try:
        status_line = await asyncio.wait_for(reader.readline(), timeout=60)
        with contextlib.suppress(ConnectionError, TimeoutError):
            said = await asyncio.wait_for(reader.read(2000), timeout=1)
    except (ConnectionError, TimeoutError):
        status_line = b""
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        writer.transport.abort()  # what is still buffered is of no use: drop it
        await asyncio.sleep(0)  # and let the transport finish closing
    status = int(status_line.split()[1]) if status_line.startswith(b"HTTP/") else 0
    return status, said.decode("latin-1")[:600]


async def keep_serving(url: str, stop: asyncio.Event) -> list[float]:
    """Another session's client, posting and reading while the attack runs: the time
    each round trip took."""
    took: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        while not stop.is_set():
            started = time.monotonic()
            async with http.post(
                f"{url}/v1/sessions/bystander/messages", json={"content": "still here?"}
            ) as posted:
                assert posted.status == 202, await posted.text()
                seq = (await posted.json())["seq"]
            async with http.get(
                f"{url}/v1/sessions/bystander/events", params={"after": seq - 1}
            ) as events:
                assert (await events.json())["events"][0]["seq"] == seq
            took.append(time.monotonic() - started)
            await asyncio.sleep(0.05)
    return took


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
async def test_oversized_and_trickled_bodies_on_every_route_keep_the_gateway_small(
    gateway_process: tuple[str, int],
) -> None:
    url, pid = gateway_process
    port = int(url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {CONTROL}"}
        for name in ("victim", "bystander"):
            async with http.post(
                f"{url}/v1/sessions", json={"session": name}, headers=headers
            ) as created:
                assert created.status == 201
                if name == "victim":
                    agent = (await created.json())["agent_token"]
        async with http.put(
            f"{url}/v1/sessions/victim/ownership",
            json={"expect_epoch": 0, "epoch": 1, "owner": "pod-a"},
            headers=headers,
        ) as owned:
            assert owned.status == 200
    resting = rss(pid)

    attacks = []
    kinds: list[tuple[str, str, bool]] = []  # (operation, oversized or trickled, with a token)
    for method, template, operation in operations(SPEC):
        # (The victim is not deleted: its routes must stay there to be attacked.)
        target = "ghost" if operation["operationId"] == "delete_session" else "victim"
        path = template.format(session=target, watermark=0) + "?epoch=1&schema_version=1"
        schemes = {next(iter(r), "") for r in operation.get("security", [{}])}
        token = CONTROL if "controlToken" in schemes else agent
        uploads = SNAPSHOT_UPLOADS if operation["operationId"] == "put_snapshot" else 1
        for _ in range(uploads):
            for sent in (None, token):  # without a token, and with the right one
                attacks.append(upload(port, method, path, sent, total=SENT_PER_UPLOAD, pause_s=0))
                attacks.append(upload(port, method, path, sent, total=60, pause_s=0.03))
                kinds += [
                    (operation["operationId"], "oversized", sent is not None),
                    (operation["operationId"], "trickled", sent is not None),
                ]
    stop = asyncio.Event()
    bystander = asyncio.create_task(keep_serving(url, stop))
    statuses = await asyncio.gather(*attacks)
    stop.set()
    took = await bystander

    peak = peak_rss(pid)
    print(
        f"\n{len(attacks)} uploads; gateway RSS resting {resting / MIB:.0f} MiB, "
        f"peak {peak / MIB:.0f} MiB (bound {(resting + HEADROOM) / MIB:.0f} MiB); "
        f"bystander round trips: {len(took)}, slowest {max(took):.2f} s"
    )
    assert peak < resting + HEADROOM
    assert took, "the other session was not served during the attack"
    assert max(took) < 5.0
    for (operation, attack, authenticated), (status, said) in zip(kinds, statuses, strict=True):
        token = "with" if authenticated else "without"
        where = f"{operation} {attack} {token} a token: {said}"
        assert status < 500, f"{where}: {status}"
        if operation not in TAKES_BODY:
            continue  # the route answered without reading the body (dropped, then closed)
        if authenticated or operation == "post_message":  # client routes need no token here
            # Refused once past the limit, or once it stopped coming: never taken.
            assert status == (413 if attack == "oversized" else 408), f"{where}: {status}"
        else:
            assert status == 401, f"{where}: {status}"  # refused before reading the body
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as health:
        assert health.status == 200  # and it is still up
