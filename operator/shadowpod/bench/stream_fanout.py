"""Append latency against the number of event streams open on the session.

A real ``shadowpod gateway`` process; one session with an owner. For each level of
open event streams (``GET …/events/stream`` on that same session, held by a separate
process), ``appends`` messages are posted one after the other (the client's append
path) while the owner long-polls for them. Reported per level: post latency and the
owner's delivery latency (post sent to entry received), p50/p99/max.

Streams are held ``stalled`` (the request is sent, the answer's head read, then the
socket is never read again, on a small receive buffer: the adversary of issue 24),
``reading`` (every event read and dropped), or ``idle``: read, but on another session,
which nothing is posted to — what idle streams cost the sessions that do work.

``--compare-source DIR`` measures a gateway started from another source tree as well
(``DIR/operator`` first on its ``PYTHONPATH``, e.g. a checkout of main), in the same
run: before and after side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp

from shadowpod.bench.machine import MachineProbe
from shadowpod.local.gateway_process import GatewayProcess

SESSION: Final = "fanout"
# Where the ``idle`` mode's streams are held: a session nothing is posted to.
IDLE_SESSION: Final = "fanout-idle"
MODES: Final = ("stalled", "reading", "idle")
STALLED_RCVBUF: Final = 4096


@dataclass(frozen=True)
class FanoutBenchConfig:
    streams: tuple[int, ...] = (0, 100, 1000)
    appends: int = 300
    modes: tuple[str, ...] = MODES
    content_bytes: int = 2000
    journal_url: str | None = None
    compare_source: Path | None = None
    workdir: Path | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> FanoutBenchConfig:
        return cls(streams=(0, 5), appends=20, **overrides)


# --- the stream holders (their own process) --------------------------------------------


async def hold_streams(url: str, session: str, count: int, mode: str) -> None:
    """Open ``count`` event streams on ``session``, say ``ready`` on stdout, and hold
    them (reading or not) until stdin closes."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = f"GET /v1/sessions/{session}/events/stream HTTP/1.1\r\nHost: {host}\r\n\r\n"
    readers: list[asyncio.StreamReader] = []
    writers: list[asyncio.StreamWriter] = []
    for _ in range(count):
        sock = socket.socket()
        if mode == "stalled":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STALLED_RCVBUF)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(request.encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"stream refused: {head[:200]!r}")
        readers.append(reader)
        writers.append(writer)
    print("ready", flush=True)

    async def drain(reader: asyncio.StreamReader) -> None:
        while await reader.read(65536):
            pass

    draining = [asyncio.create_task(drain(r)) for r in readers] if mode != "stalled" else []
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for task in draining:
        task.cancel()
    for writer in writers:
        writer.transport.abort()


@contextlib.asynccontextmanager
async def _streams(url: str, count: int, mode: str) -> AsyncIterator[None]:
    if count == 0:
        yield
        return
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import asyncio, sys; from shadowpod.bench.stream_fanout import hold_streams; "
        "asyncio.run(hold_streams(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))",
        url,
        IDLE_SESSION if mode == "idle" else SESSION,
        str(count),
        mode,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        line = await asyncio.wait_for(holder.stdout.readline(), 300)
        if line.strip() != b"ready":
            raise RuntimeError(f"the stream holder did not get its {count} streams")
        yield
    finally:
        holder.stdin.close()
        try:
            await asyncio.wait_for(holder.wait(), 30)
        except TimeoutError:
            holder.kill()
            await holder.wait()


# --- one measurement ---------------------------------------------------------------------


def _figures(samples: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        "max_ms": round(1000 * ordered[-1], 1),
    }


async def _level(
    http: aiohttp.ClientSession, url: str, agent_token: str, config: FanoutBenchConfig
) -> dict[str, Any]:
    """Post ``appends`` messages one after the other while the owner long-polls."""
    content = "x" * config.content_bytes
    owner = {"Authorization": f"Bearer {agent_token}"}
    async with http.get(f"{url}/v1/sessions/{SESSION}") as status:
        after = int((await status.json())["head"])
    sent: dict[str, float] = {}
    delivered: list[float] = []
    done = asyncio.Event()

    async def deliver() -> None:
        nonlocal after
        while not done.is_set() or len(delivered) < len(sent):
            async with http.get(
                f"{url}/v1/sessions/{SESSION}/owner/entries",
                params={"epoch": 1, "after": after, "wait": 2},
                headers=owner,
            ) as polled:
                entries = (await polled.json())["entries"]
            now = time.perf_counter()
            for entry in entries:
                if entry["id"] in sent:
                    delivered.append(now - sent[entry["id"]])
            after = entries[-1]["seq"] if entries else after

    delivering = asyncio.create_task(deliver())
    posts: list[float] = []
    failures = 0
    started = time.perf_counter()
    for n in range(config.appends):
        key = f"p{after}-{n}"
        begun = time.perf_counter()
        sent[key] = begun
        async with http.post(
            f"{url}/v1/sessions/{SESSION}/messages", json={"id": key, "content": content}
        ) as posted:
            await posted.read()
            if posted.status == 202:
                posts.append(time.perf_counter() - begun)
            else:
                failures += 1
                del sent[key]
    took = time.perf_counter() - started
    done.set()
    await asyncio.wait_for(delivering, 300)
    return {
        "posts": _figures(posts),
        "post_failures": failures,
        "posts_per_s": round(len(posts) / took, 1),
        "owner_delivery": _figures(delivered),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


async def _until_streams_closed(http: aiohttp.ClientSession, url: str) -> None:
    """The gateway has seen the last level's streams go (its ``/metrics`` says so).

    A build that notices a departed client only when it next writes to it (before the
    ping did) is sent one message a second meanwhile: each commit makes every stream
    write, and a stream whose client left then ends.
    """
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        async with http.get(f"{url}/metrics") as metrics:
            lines = (await metrics.text()).splitlines()
        open_now = sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith("shadowpod_open_streams{")
        )
        if open_now == 0:
            return
        await asyncio.sleep(1)
        async with http.post(
            f"{url}/v1/sessions/{SESSION}/messages", json={"content": "anyone there?"}
        ) as posted:
            await posted.read()
    raise RuntimeError("the gateway still counts the last level's streams after 120 s")


@contextlib.contextmanager
def _pythonpath(source: Path | None) -> Iterator[None]:
    """The gateway process inherits this environment: ``source`` goes first."""
    if source is None:
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(source / "operator"), before or ""])
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


async def _measure(config: FanoutBenchConfig, source: Path | None, mode: str) -> dict[str, Any]:
    most = max(config.streams)
    with tempfile.TemporaryDirectory(dir=config.workdir, prefix="bench-fanout-") as tmp:
        journal = config.journal_url
        if journal is not None and journal.startswith("postgres"):
            schema = f"bench_fanout_{os.getpid()}_{int(time.time() * 1000) % 10**9}"
            journal += ("&" if "?" in journal else "?") + f"shadowpod_schema={schema}"
        gateway = GatewayProcess(
            Path(tmp),
            journal_url=journal,
            extra_args=[
                "--max-streams",
                str(most + 10),
                "--max-streams-per-session",
                str(most + 10),
            ],
        )
        with _pythonpath(source):
            await gateway.start()
        levels: dict[str, Any] = {}
        try:
            control = {"Authorization": f"Bearer {gateway.control_token}"}
            timeout = aiohttp.ClientTimeout(total=300)
            connector = aiohttp.TCPConnector(limit=10)
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
                async with http.post(
                    f"{gateway.url}/v1/sessions", json={"session": SESSION}, headers=control
                ) as created:
                    agent_token = (await created.json())["agent_token"]
                if mode == "idle":
                    async with http.post(
                        f"{gateway.url}/v1/sessions",
                        json={"session": IDLE_SESSION},
                        headers=control,
                    ) as idle:
                        if idle.status != 201:
                            raise RuntimeError(f"creating the idle session: {idle.status}")
                async with http.put(
                    f"{gateway.url}/v1/sessions/{SESSION}/ownership",
                    json={"expect_epoch": 0, "epoch": 1, "owner": "bench-owner"},
                    headers=control,
                ) as owned:
                    if owned.status != 200:
                        raise RuntimeError(f"taking ownership: {owned.status}")
                for count in config.streams:
                    async with _streams(gateway.url, count, mode):
                        levels[str(count)] = await _level(http, gateway.url, agent_token, config)
                    await _until_streams_closed(http, gateway.url)
        finally:
            await gateway.stop()
    return {
        "source": str(source) if source is not None else "this build",
        "streams_held": mode,
        "by_open_streams": levels,
    }


async def run_fanout_bench(config: FanoutBenchConfig) -> dict[str, Any]:
    probe = MachineProbe()
    probe.start()
    runs = []
    for mode in config.modes:
        runs.append(await _measure(config, None, mode))
        if config.compare_source is not None:
            runs.append(await _measure(config, config.compare_source, mode))
    journal = config.journal_url or "sqlite"
    return {
        "benchmark": "stream-fanout",
        "journal": "postgresql" if journal.startswith("postgres") else "sqlite",
        "appends_per_level": config.appends,
        "content_bytes": config.content_bytes,
        "open_streams": list(config.streams),
        "runs": runs,
        "machine": probe.report(),
    }
