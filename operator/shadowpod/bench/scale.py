"""``shadowpod bench scale``: gateway replicas on one PostgreSQL journal.

Run twice in one report, with one gateway process and with ``replicas`` of them, each on
a fresh schema of one PostgreSQL database (``gateway/placement.py``):

- ``sessions`` sessions are created, then clients post messages at ``rate`` per second
  in all (open loop: a message is sent at its time whether or not earlier ones were
  answered) for ``duration_s``, each to a random session through a random replica:
  the client latency of a post (the replica forwarding it to the session's lease holder
  when it is not the holder itself) and the rate the gateways kept up with;
- the resident memory of each replica after the load (``VmRSS``);
- with several replicas, the takeover: the replica holding the most leases is killed
  (SIGKILL), and a sample of its sessions are posted to through the others until each
  is accepted — the time from the kill to each session's first accepted post (bound:
  the lease time after the dead replica's last renewal).

Everything runs on this machine: the clients, the replicas and PostgreSQL share its
cores, so the rate reached says as much about the machine as about the gateway.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson
import psycopg

from shadowpod.bench.machine import MachineProbe
from shadowpod.local.gateway_process import GatewayProcess, free_port
from shadowpod.stats import percentile, summary_ms

# Posts in flight at most (a gateway that falls behind is not buried in connections).
MAX_IN_FLIGHT: Final = 512
# Sessions of the killed replica posted to after the kill (each until accepted).
TAKEOVER_SAMPLE: Final = 200


@dataclass(frozen=True)
class ScaleBenchConfig:
    replicas: int = 3
    sessions: int = 10_000
    rate: float = 2_000.0
    duration_s: float = 20.0
    lease_ttl_s: float = 10.0
    dsn: str = "postgresql://127.0.0.1:5432/test"
    workdir: Path | None = None


@asynccontextmanager
async def _gateways(
    config: ScaleBenchConfig, count: int, workdir: Path
) -> AsyncIterator[tuple[list[GatewayProcess], str, str]]:
    schema = f"bench_scale_{uuid.uuid4().hex[:12]}"
    token = secrets.token_urlsafe(24)
    processes = []
    for n in range(count):
        port = free_port()
        processes.append(
            GatewayProcess(
                workdir / f"gw{n}",
                journal_url=f"{config.dsn}?shadowpod_schema={schema}",
                port=port,
                control_token=token,
                extra_args=(
                    "--advertise-url",
                    f"http://127.0.0.1:{port}",
                    "--replica-id",
                    f"gw{n}",
                    "--lease-ttl",
                    str(config.lease_ttl_s),
                    "--log-level",
                    "warning",
                ),
            )
        )
    try:
        await asyncio.gather(*(p.start() for p in processes))
        yield processes, schema, token
    finally:
        for process in processes:
            await process.stop()
        async with await psycopg.AsyncConnection.connect(config.dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _rss_mib(process: GatewayProcess) -> float | None:
    if process.process is None:
        return None
    try:
        for line in Path(f"/proc/{process.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


async def _create(http: aiohttp.ClientSession, urls: Sequence[str], token: str, count: int) -> None:
    names = iter(range(count))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def worker() -> None:
        for n in names:
            body = orjson.dumps({"session": f"s{n}"})
            url = urls[n % len(urls)] + "/v1/sessions"
            async with http.post(url, data=body, headers=headers) as response:
                if response.status >= 300:
                    raise RuntimeError(
                        f"creating session s{n}: {response.status} {await response.text()}"
                    )

    await asyncio.gather(*(worker() for _ in range(32)))


async def _post(http: aiohttp.ClientSession, url: str, session: str, message_id: str) -> int:
    body = orjson.dumps({"id": message_id, "content": "hello", "role": "user"})
    async with http.post(
        f"{url}/v1/sessions/{session}/messages",
        data=body,
        headers={"Content-Type": "application/json"},
    ) as response:
        await response.read()
        return response.status


async def _load(
    http: aiohttp.ClientSession, urls: Sequence[str], config: ScaleBenchConfig
) -> dict[str, Any]:
    """Open-loop posts at ``rate`` for ``duration_s``: latencies of those answered 2xx."""
    latencies: list[float] = []
    failed: dict[str, int] = {}
    in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()
    skipped = 0

    async def one(n: int) -> None:
        session = f"s{random.randrange(config.sessions)}"
        started = time.monotonic()
        try:
            status = await _post(http, random.choice(urls), session, f"load-{n}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
        else:
            if status < 300:
                latencies.append(time.monotonic() - started)
            else:
                failed[str(status)] = failed.get(str(status), 0) + 1
        finally:
            in_flight.release()

    total = int(config.rate * config.duration_s)
    started = time.monotonic()
    for n in range(total):
        due = started + n / config.rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if in_flight.locked():
            skipped += 1  # the gateways are this far behind: the client does not pile on
            continue
        await in_flight.acquire()
        task = asyncio.create_task(one(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    return {
        "offered": total,
        "accepted": len(latencies),
        "accepted_per_s": round(len(latencies) / elapsed, 1),
        "not_sent_too_many_in_flight": skipped,
        "failed": failed,
        "latency_ms": summary_ms(latencies) if latencies else None,
        "elapsed_s": round(elapsed, 2),
    }


async def _leases(dsn: str, schema: str) -> dict[str, list[str]]:
    """The sessions each replica holds a live lease of."""
    held: dict[str, list[str]] = {}
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (
            await conn.execute(
                f"SELECT holder, session FROM {schema}.leases WHERE expires > clock_timestamp()"
            )
        ).fetchall()
    for holder, session in rows:
        held.setdefault(str(holder), []).append(str(session))
    return held


async def _takeover(
    http: aiohttp.ClientSession,
    processes: list[GatewayProcess],
    schema: str,
    config: ScaleBenchConfig,
) -> dict[str, Any]:
    held = await _leases(config.dsn, schema)
    victim_id = max(held, key=lambda replica: len(held[replica]))
    victim = int(victim_id.removeprefix("gw"))
    sample = random.sample(held[victim_id], min(TAKEOVER_SAMPLE, len(held[victim_id])))
    survivors = [p.url for n, p in enumerate(processes) if n != victim]
    await processes[victim].stop(kill=True)
    killed = time.monotonic()
    took: list[float] = []

    async def until_accepted(session: str) -> None:
        while time.monotonic() - killed < config.lease_ttl_s * 3:
            try:
                if (
                    await _post(http, random.choice(survivors), session, f"takeover-{session}")
                    < 300
                ):
                    took.append(time.monotonic() - killed)
                    return
            except (aiohttp.ClientError, TimeoutError):
                pass
            # Asked again four times a second: the figure is that fine, and the
            # survivors are not kept busy answering 503s.
            await asyncio.sleep(0.25)

    await asyncio.gather(*(until_accepted(s) for s in sample))
    return {
        "killed": victim_id,
        "its_sessions": len(held[victim_id]),
        "leases_held": {replica: len(sessions) for replica, sessions in sorted(held.items())},
        "sampled": len(sample),
        "taken_over": len(took),
        "takeover_s": {
            "p50": round(percentile(took, 50), 2),
            "p99": round(percentile(took, 99), 2),
            "max": round(max(took), 2),
        }
        if took
        else None,
        "bound_s": config.lease_ttl_s,
    }


async def _one_run(config: ScaleBenchConfig, count: int, workdir: Path) -> dict[str, Any]:
    async with _gateways(config, count, workdir / f"replicas-{count}") as (
        processes,
        schema,
        token,
    ):
        urls = [p.url for p in processes]
        connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT + 64)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            created = time.monotonic()
            await _create(http, urls, token, config.sessions)
            create_s = time.monotonic() - created
            load = await _load(http, urls, config)
            memory = {f"gw{n}": _rss_mib(p) for n, p in enumerate(processes)}
            run: dict[str, Any] = {
                "replicas": count,
                "create_sessions_s": round(create_s, 1),
                "load": load,
                "rss_mib": memory,
            }
            if count > 1:
                run["takeover"] = await _takeover(http, processes, schema, config)
    return run


async def run_scale_bench(config: ScaleBenchConfig) -> dict[str, Any]:
    probe = MachineProbe()
    probe.start()
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="shadowpod-bench-scale-"))
    try:
        runs = [await _one_run(config, count, workdir) for count in sorted({1, config.replicas})]
    finally:
        if config.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "benchmark": "scale",
        "sessions": config.sessions,
        "rate": config.rate,
        "duration_s": config.duration_s,
        "lease_ttl_s": config.lease_ttl_s,
        "runs": runs,
        "machine": probe.report(),
    }
