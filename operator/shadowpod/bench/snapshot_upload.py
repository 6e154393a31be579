"""One large snapshot against a running gateway: what it costs the gateway and the others.

A real ``shadowpod gateway`` process (SQLite journal) is sent one snapshot of
``size_mib`` while ``bystanders`` other sessions keep posting messages. Reported: the
gateway's resting and peak resident set (``VmHWM``), how long the upload took and what
it was answered, and the other sessions' post latency before the upload and while it
streams.

``--compare-source DIR`` runs the same measurement, in turn, against a gateway started
from another source tree (``DIR/operator`` first on ``PYTHONPATH``, e.g. a checkout of
main): before and after, side by side on the same machine at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from shadowpod.bench.machine import MachineProbe

MIB: Final = 1024 * 1024
CONTROL_TOKEN: Final = "bench-control-token"
_SENTENCE: Final = (
    "the agent wrote a reply about the deployment while user asked for logs of node "
    "migration journal snapshot fence epoch owner shadow memory tool call result "
    "schedule fact kubernetes pod gateway latency budget retry error message turn"
)
WORDS: Final = _SENTENCE.split()


@dataclass(frozen=True)
class SnapshotBenchConfig:
    size_mib: int = 250
    bystanders: int = 4
    baseline_s: float = 5.0
    post_pause_s: float = 0.02
    compare_source: Path | None = None
    workdir: Path | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> SnapshotBenchConfig:
        return cls(size_mib=8, bystanders=2, baseline_s=0.5, **overrides)


@functools.cache
def _blocks(count: int, size: int, seed: int = 7) -> list[bytes]:
    """Transcript-shaped JSON text (``{...},`` items), ``size`` bytes each: words drawn
    at random compress about as a real conversation does."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(count):
        parts: list[bytes] = []
        length = 0
        while length < size:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60)))
            role = "user" if rng.random() < 0.5 else "assistant"
            item = b'{"role":"' + role.encode() + b'","content":"' + words.encode() + b'"},'
            parts.append(item)
            length += len(item)
        blocks.append(b"".join(parts)[:size])
    return blocks


async def _document(watermark: int, size: int) -> AsyncIterator[bytes]:
    """A ``size``-byte state document, generated as it is sent."""
    head = b'{"watermark":' + str(watermark).encode() + b',"schema_version":3,"filler":"'
    tail = b'"}'
    blocks = _blocks(16, MIB)
    # The filler is one JSON string: the blocks' quotes are escaped away.
    blocks = [b.replace(b'"', b"'") for b in blocks]
    yield head
    left = size - len(head) - len(tail)
    n = 0
    while left > 0:
        piece = blocks[n % len(blocks)][:left]
        yield piece
        left -= len(piece)
        n += 1
    yield tail


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _status_kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for pid {pid}")


@contextlib.contextmanager
def _gateway(workdir: Path, source: Path | None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    tokens = workdir / "control.tokens"
    tokens.write_text(CONTROL_TOKEN + "\n")
    port = _free_port()
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source / "operator"), env.get("PYTHONPATH", "")])
    log = (workdir / "gateway.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shadowpod",
            "gateway",
            "--journal",
            f"sqlite:///{workdir / 'journal.db'}",
            "--port",
            str(port),
            "--control-token-file",
            str(tokens),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start: see {workdir / 'gateway.log'}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@dataclass
class _Posts:
    latencies_s: list[float] = field(default_factory=list)
    failures: int = 0


async def _post_loop(
    http: aiohttp.ClientSession, url: str, session: str, stop: asyncio.Event, pause_s: float
) -> _Posts:
    posts = _Posts()
    while not stop.is_set():
        started = time.perf_counter()
        try:
            async with http.post(
                f"{url}/v1/sessions/{session}/messages", json={"content": "still here?"}
            ) as posted:
                await posted.read()
                ok = posted.status == 202
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if ok:
            posts.latencies_s.append(time.perf_counter() - started)
        else:
            posts.failures += 1
        await asyncio.sleep(pause_s)
    return posts


async def _posting(
    http: aiohttp.ClientSession, url: str, config: SnapshotBenchConfig, stop: asyncio.Event
) -> list[_Posts]:
    return await asyncio.gather(
        *(
            _post_loop(http, url, f"bystander-{n}", stop, config.post_pause_s)
            for n in range(config.bystanders)
        )
    )


def _latency(posts: list[_Posts]) -> dict[str, Any]:
    samples = sorted(s for p in posts for s in p.latencies_s)
    failures = sum(p.failures for p in posts)
    if not samples:
        return {"posts": 0, "failures": failures}
    return {
        "posts": len(samples),
        "failures": failures,
        "p50_ms": round(1000 * statistics.median(samples), 1),
        "p99_ms": round(1000 * samples[min(len(samples) - 1, int(len(samples) * 0.99))], 1),
        "max_ms": round(1000 * samples[-1], 1),
    }


async def _measure(config: SnapshotBenchConfig, source: Path | None) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(dir=config.workdir, prefix="bench-snapshot-") as tmp,
        _gateway(Path(tmp), source) as (url, process),
    ):
        control = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for name in ["big"] + [f"bystander-{n}" for n in range(config.bystanders)]:
                async with http.post(
                    f"{url}/v1/sessions", json={"session": name}, headers=control
                ) as created:
                    if created.status != 201:
                        raise RuntimeError(f"creating {name}: {created.status}")
                    if name == "big":
                        agent_token = (await created.json())["agent_token"]
            async with http.put(
                f"{url}/v1/sessions/big/ownership",
                json={"expect_epoch": 0, "epoch": 1, "owner": "bench-owner"},
                headers=control,
            ) as owned:
                if owned.status != 200:
                    raise RuntimeError(f"taking ownership: {owned.status} {await owned.text()}")
            async with http.post(
                f"{url}/v1/sessions/big/messages", json={"content": "remember this"}
            ) as posted:
                watermark = (await posted.json())["seq"]
            resting_kib = _status_kib(process.pid, "VmRSS")

            stop = asyncio.Event()
            baseline = asyncio.create_task(_posting(http, url, config, stop))
            await asyncio.sleep(config.baseline_s)
            stop.set()
            before = await baseline

            stop = asyncio.Event()
            during = asyncio.create_task(_posting(http, url, config, stop))
            size = config.size_mib * MIB
            started = time.perf_counter()
            async with http.put(
                f"{url}/v1/sessions/big/snapshots/{watermark}",
                params={"epoch": "1", "schema_version": "3"},
                data=_document(watermark, size),
                headers={"Authorization": f"Bearer {agent_token}"},
            ) as put:
                answer = await put.text()
                status = put.status
            upload_s = time.perf_counter() - started
            stop.set()
            meanwhile = await during
            peak_kib = _status_kib(process.pid, "VmHWM")
            alive = process.poll() is None
    return {
        "source": str(source) if source is not None else "this build",
        "upload": {
            "bytes": size,
            "status": status,
            "answer": answer[:300],
            "seconds": round(upload_s, 2),
        },
        "gateway_rss_mib": {
            "resting": round(resting_kib / 1024, 1),
            "peak": round(peak_kib / 1024, 1),
            "peak_over_resting": round((peak_kib - resting_kib) / 1024, 1),
        },
        "gateway_alive_after": alive,
        "other_sessions_post_latency": {
            "before_upload": _latency(before),
            "during_upload": _latency(meanwhile),
        },
    }


async def run_snapshot_bench(config: SnapshotBenchConfig) -> dict[str, Any]:
    _blocks(16, MIB)  # made before anything is timed
    probe = MachineProbe()
    probe.start()
    runs = [await _measure(config, None)]
    if config.compare_source is not None:
        runs.append(await _measure(config, config.compare_source))
    return {
        "benchmark": "snapshot",
        "size_mib": config.size_mib,
        "bystanders": config.bystanders,
        "journal": "sqlite",
        "runs": runs,
        "machine": probe.report(),
    }
