"""The operator at scale, on the emulated API (``python -m tests.kube.bench_operator``).

The operator runs as its own process (``shadowpod operator``), against the tests'
API-server emulator and a real gateway; a kubelet stand-in makes pods Running and
Ready at once without running anything ("no process" mode). Measured:

- the operator's RSS after ``sessions`` AgentSessions are Running;
- create → ``Running`` per session (p50/p99), as a client watching status sees it;
- with ``--idle-window S``: the requests the operator makes to the API server and to
  the gateway while the sessions are left alone for S seconds, per second (from its
  ``shadowpod_operator_requests_total``), and its RSS then;
- with ``--suspended`` (and ``--idle-window S``): every session suspended first
  (``spec.operatingMode: Suspended``; no pod), then for S seconds of nothing the
  operator's and the gateway's requests a second and both processes' RSS, against
  their RSS before any session existed: what a suspended session costs;
- with ``--created-suspended`` instead: every session created suspended
  (``operatingMode: Suspended`` in the manifest: no pod is started), then the same
  idle window;
- image bump → AgentMigration created by the operator (p50/p99), for ``bumped``
  sessions;
- then ``migrations`` sessions migrated live at once with the real data plane (pods
  run the reference agent as processes), each under light client load: all must
  succeed with nothing lost, doubled or reordered.

The emulator and the kubelet stand-in are test doubles of ``tests/kube``, so this
benchmark lives beside them, not in the shipped package (which never imports tests):
run it from a checkout, ``.venv/bin/python -m tests.kube.bench_operator --json``. On a
real API server, ``shadowpod bench cluster`` measures the same reactions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import kmock

from shadowpod import eventloop
from shadowpod.bench.informer import follow, list_all
from shadowpod.bench.machine import MachineProbe
from shadowpod.kube import names
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.local.gateway_process import GatewayProcess, free_port
from shadowpod.local.load import ClientLoad
from tests.kube import connection, emulator, kubelet
from tests.kube.conftest import local_images

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "bench"


@dataclass(frozen=True)
class OperatorBenchConfig:
    sessions: int = 1000
    bumped: int = 100
    migrations: int = 50
    idle_window_s: float = 0.0  # 0: no idle measurement
    suspended: bool = False  # suspend every session before the idle window
    # Create every session suspended (``operatingMode: Suspended`` from the start: no
    # pod is started) instead of suspending running ones.
    created_suspended: bool = False
    workdir: Path = Path("/tmp/shadowpod-bench-operator")
    timeout_s: float = 900.0
    settle_s: float = 35.0  # before the idle window: the passes of the sessions' start end


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 4), "p99": round(p99, 4), "n": len(ordered)}


def _rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


# Fifty shadows start at once on the benchmark's machine (two cores, here): each
# Python agent's start and restore then takes far longer than alone. The defaults
# (30 s a phase) roll such a crowd back (safely: nothing lost); these give it room.
LIVE_POLICY: Final = {
    "drainGracePeriodSeconds": 2,
    "phaseTimeoutSeconds": 180,
    "maxDurationSeconds": 600,
}


# No agent process runs in the scale part: a suspend waits for a final snapshot nobody
# takes for at most the phase timeout (30 s by default); the journal alone resumes it.
SUSPEND_POLICY: Final = {"drainGracePeriodSeconds": 2, "phaseTimeoutSeconds": 3}


def _session(
    name: str, image: str, policy: dict[str, int] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"image": image, "migration": policy or {"drainGracePeriodSeconds": 2}, **spec},
    }


async def _operator(
    kubeconfig: Path, gateway: GatewayProcess, log: Path, metrics_port: int
) -> asyncio.subprocess.Process:
    token = gateway.workdir / "control-token"
    with log.open("ab") as sink:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "shadowpod", "operator",
            "--kubeconfig", str(kubeconfig),
            "-n", NAMESPACE,
            "--gateway-url", gateway.url,
            "--control-token-file", str(token),
            "--metrics-port", str(metrics_port),
            "--metrics-host", "127.0.0.1",
            "--log-level", "warning",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=sink,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip


async def _wait_all(
    api: KubeApi, plural: str, names_: set[str], done: Any, timeout_s: float
) -> dict[str, float]:
    """When each of ``names_`` first satisfied ``done(body)`` (monotonic time), from one
    watch (a LIST, then its changes). Listing every object a few times a second instead
    took the emulator's whole process at 1,000 sessions: the operator's own requests
    then timed out behind the benchmark's."""
    seen: dict[str, float] = {}
    if not names_:
        return seen
    complete = asyncio.Event()

    def on_event(kind: str, body: dict[str, Any], at: float) -> None:
        name = body["metadata"]["name"]
        if kind != "DELETED" and name in names_ and name not in seen and done(body):
            seen[name] = at
            if len(seen) == len(names_):
                complete.set()

    path = namespaced(plural, NAMESPACE)
    following = asyncio.create_task(follow(api, path, on_event))
    deadline = time.monotonic() + timeout_s
    try:
        while not complete.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(complete.wait(), min(15.0, deadline - time.monotonic()))
            if not complete.is_set():
                # A watch whose connection the busy emulator dropped without a word
                # would wait out its request timeout: a LIST now and then catches up.
                items, _ = await list_all(api, path)
                for item in items:
                    on_event("LISTED", item, time.monotonic())
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
    return dict(seen)


def _running(body: dict[str, Any]) -> bool:
    return (body.get("status") or {}).get("phase") == "Running"


def _suspended(body: dict[str, Any]) -> bool:
    return (body.get("status") or {}).get("phase") == "Suspended"


async def run_operator_bench(config: OperatorBenchConfig) -> dict[str, Any]:
    probe = MachineProbe()
    probe.start()
    config.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": {k: str(v) for k, v in vars(config).items()}}
    gateway = GatewayProcess(config.workdir / "gateway")
    await gateway.start()
    crds = [REPO / "crds"]
    try:
        async with (
            emulator.ApiServerEmulator(crds=crds, keep_requests=False) as server,
            kmock.Server(server),
        ):
            kube = connection.KubeConnection.to_emulator(
                str(server.url).rstrip("/"), config.workdir
            )
            async with kube.api() as client:
                api = KubeApi(client)
                await api.create(
                    "/api/v1/namespaces",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                )
                result["scale"] = await _scale(api, client, kube, gateway, config)
        if config.migrations:
            result["live"] = await _live(config)
    finally:
        await gateway.stop()
    result["targets"] = _targets(result)
    result["machine"] = probe.report()
    return result


def _targets(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's targets: RSS ≤ 200 MB at the sessions asked for; every live
    migration succeeded with nothing lost."""
    scale = result.get("scale") or {}
    live = result.get("live") or {}
    rss = scale.get("operator_rss_mb")
    targets: dict[str, dict[str, Any]] = {
        "operator_rss_mb": {
            "measured": rss,
            "target": "<= 200 MB",
            "met": None if rss is None else rss <= 200,
        },
    }
    up = "suspended" if (scale.get("suspended") or {}).get("created_suspended") else "running"
    count = (scale.get("suspended") or {}).get("suspended") if up == "suspended" else None
    count = scale.get("running") if count is None else count
    targets[f"sessions_{up}"] = {
        "measured": count,
        "target": f"all {scale.get('sessions')}",
        "met": count == scale.get("sessions"),
    }
    per = ((scale.get("idle") or {}).get("per_session")) if scale.get("suspended") else None
    if per:
        rates = [
            per[k]
            for k in (
                "operator_api_requests_per_s",
                "operator_gateway_requests_per_s",
                "gateway_served_per_s",
            )
        ]
        worst = None if None in rates else max(rates)
        targets["suspended_requests_per_s_per_session"] = {
            "measured": worst,
            "target": "<= 0.001 (near zero: one request per session per 1000 s at most)",
            "met": None if worst is None else worst <= 0.001,
        }
    if live:
        clean = all(live.get(k) == 0 for k in ("lost", "duplicated", "reordered"))
        targets["live_migrations"] = {
            "measured": f"{live.get('succeeded')}/{live.get('migrations')} succeeded,"
            f" {live.get('lost')} lost, {live.get('duplicated')} duplicated",
            "target": "all succeed, 0 lost / duplicated / reordered",
            "met": live.get("succeeded") == live.get("migrations") and clean,
        }
    return targets


async def _scale(
    api: KubeApi,
    client: Any,
    kube: Any,
    gateway: GatewayProcess,
    config: OperatorBenchConfig,
) -> dict[str, Any]:
    images = local_images()
    async with kubelet.Kubelet(
        client, images, config.workdir / "kubelet", run_processes=False
    ) as nodes:
        await nodes.add_node("node-1")
        metrics_port = free_port()
        operator = await _operator(
            kube.kubeconfig, gateway, config.workdir / "operator.log", metrics_port
        )
        try:
            await asyncio.sleep(2.0)
            baseline = _rss_mb(operator.pid)
            gateway_baseline = _rss_mb(_pid(gateway))
            names_ = [f"s{i:05d}" for i in range(config.sessions)]
            created: dict[str, float] = {}
            policy = SUSPEND_POLICY if config.suspended else None
            mode = {"operatingMode": "Suspended"} if config.created_suspended else {}
            for name in names_:
                manifest = _session(name, "refagent:v1", policy, **mode)
                await api.create(namespaced("agentsessions", NAMESPACE), manifest)
                created[name] = time.monotonic()
            up = _suspended if config.created_suspended else _running
            running = await _wait_all(api, "agentsessions", set(names_), up, config.timeout_s)
            rss = _rss_mb(operator.pid)
            suspended = None
            if config.created_suspended:
                suspended = {
                    "suspended": len(running),
                    "created_suspended": True,
                    "create_to_suspended_s": _percentiles(
                        [running[n] - created[n] for n in running]
                    ),
                    "pods": len(await api.list(namespaced("pods", NAMESPACE))),
                }
            elif config.suspended:
                suspended = await _suspend_all(api, names_, config.timeout_s)
            idle = await _idle(
                metrics_port, operator.pid, config.idle_window_s, gateway, config.settle_s
            )
            if idle is not None:
                idle["operator_rss_mb_before_sessions"] = baseline
                idle["gateway_rss_mb_before_sessions"] = gateway_baseline
                idle.update(_per_session(idle, config.sessions))
            bumped = names_[: config.bumped]
            bumps: dict[str, float] = {}
            for name in bumped:
                await api.patch(
                    namespaced("agentsessions", NAMESPACE, name), {"spec": {"image": "refagent:v2"}}
                )
                bumps[name] = time.monotonic()
            wanted = {names.image_migration(n, 2): n for n in bumped}
            started = await _wait_all(
                api, "agentmigrations", set(wanted), lambda _: True, config.timeout_s
            )
            return {
                "sessions": config.sessions,
                "running": 0 if config.created_suspended else len(running),
                "operator_rss_mb_idle": baseline,
                "operator_rss_mb": rss,
                "suspended": suspended,
                "idle": idle,
                "create_to_running_s": _percentiles([running[n] - created[n] for n in running]),
                "bumped": len(bumped),
                "bump_to_migration_s": _percentiles(
                    [started[m] - bumps[wanted[m]] for m in started]
                ),
            }
        finally:
            operator.terminate()
            await operator.wait()


async def _requests(metrics_port: int) -> dict[str, float]:
    """The operator's ``shadowpod_operator_requests_total``, by where they went."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{metrics_port}/metrics") as answer,
    ):
        text = await answer.text()
    found = re.findall(r'^shadowpod_operator_requests_total\{to="(\w+)"\} (\S+)$', text, re.M)
    return {to: float(count) for to, count in found}


async def _idle(
    metrics_port: int, pid: int, window_s: float, gateway: GatewayProcess, settle_s: float = 35.0
) -> dict[str, Any] | None:
    """The operator's requests a second while nothing changes, after the passes of the
    sessions' start have ended (one period of 30 s, and a bit); the requests the
    gateway served meanwhile (the operator's and anyone's: nobody else calls it)."""
    if window_s <= 0:
        return None
    await asyncio.sleep(settle_s)
    before, started = await _requests(metrics_port), time.monotonic()
    served = await _gateway_requests(gateway)
    await asyncio.sleep(window_s)
    after, elapsed = await _requests(metrics_port), time.monotonic() - started
    served = await _gateway_requests(gateway) - served - 1  # less this look's own
    return {
        "window_s": round(elapsed, 1),
        "api_requests_per_s": round((after["api"] - before["api"]) / elapsed, 3),
        "gateway_requests_per_s": round((after["gateway"] - before["gateway"]) / elapsed, 3),
        "gateway_served_per_s": round(served / elapsed, 3),
        "operator_rss_mb": _rss_mb(pid),
        "gateway_rss_mb": _rss_mb(_pid(gateway)),
    }


def _pid(gateway: GatewayProcess) -> int:
    assert gateway.process is not None
    return gateway.process.pid


async def _gateway_requests(gateway: GatewayProcess) -> float:
    """Every request the gateway has answered (``shadowpod_http_requests_total``)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gateway.url}/metrics") as answer,
    ):
        text = await answer.text()
    found = re.findall(r"^shadowpod_http_requests_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(count) for count in found)


def _per_session(idle: dict[str, Any], sessions: int) -> dict[str, Any]:
    """What one session adds: requests a second, and RSS over the processes' own."""

    def each(total: float | None, base: float | None = 0.0) -> float | None:
        if total is None or base is None or not sessions:
            return None
        return round((total - base) / sessions, 6)

    return {
        "per_session": {
            "operator_api_requests_per_s": each(idle["api_requests_per_s"]),
            "operator_gateway_requests_per_s": each(idle["gateway_requests_per_s"]),
            "gateway_served_per_s": each(idle["gateway_served_per_s"]),
            "operator_rss_kb": each(
                None if idle["operator_rss_mb"] is None else idle["operator_rss_mb"] * 1024,
                None
                if idle["operator_rss_mb_before_sessions"] is None
                else idle["operator_rss_mb_before_sessions"] * 1024,
            ),
            "gateway_rss_kb": each(
                None if idle["gateway_rss_mb"] is None else idle["gateway_rss_mb"] * 1024,
                None
                if idle["gateway_rss_mb_before_sessions"] is None
                else idle["gateway_rss_mb_before_sessions"] * 1024,
            ),
        }
    }


async def _suspend_all(api: KubeApi, names_: list[str], timeout_s: float) -> dict[str, Any]:
    """Suspend every session (no agent process runs: the final snapshot is waited for
    no longer than the sessions' phase timeout) and wait until all are Suspended."""
    asked: dict[str, float] = {}
    for name in names_:
        await api.patch(
            namespaced("agentsessions", NAMESPACE, name), {"spec": {"operatingMode": "Suspended"}}
        )
        asked[name] = time.monotonic()

    done = await _wait_all(api, "agentsessions", set(names_), _suspended, timeout_s)
    return {
        "suspended": len(done),
        "ask_to_suspended_s": _percentiles([done[n] - asked[n] for n in done]),
    }


async def _live(
    config: OperatorBenchConfig,
) -> dict[str, Any]:
    """``migrations`` sessions, real agents, migrated at once under light load."""
    workdir = config.workdir / "live"
    workdir.mkdir(parents=True, exist_ok=True)
    gateway = GatewayProcess(workdir / "gateway")
    await gateway.start()
    images = local_images()
    try:
        async with (
            emulator.ApiServerEmulator(crds=[REPO / "crds"], keep_requests=False) as server,
            kmock.Server(server),
        ):
            kube = connection.KubeConnection.to_emulator(str(server.url).rstrip("/"), workdir)
            async with (
                kube.api() as client,
                kubelet.Kubelet(client, images, workdir / "kubelet") as nodes,
            ):
                await nodes.add_node("node-1")
                api = KubeApi(client)
                await api.create(
                    "/api/v1/namespaces",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                )
                operator = await _operator(
                    kube.kubeconfig, gateway, workdir / "operator.log", free_port()
                )
                try:
                    return await _migrate_all(api, gateway, config)
                finally:
                    operator.terminate()
                    await operator.wait()
    finally:
        await gateway.stop()


async def _migrate_all(
    api: KubeApi, gateway: GatewayProcess, config: OperatorBenchConfig
) -> dict[str, Any]:
    from shadowpod.client.gateway import GatewayClient

    names_ = [f"live{i:03d}" for i in range(config.migrations)]
    for name in names_:
        manifest = _session(name, "refagent:v1", LIVE_POLICY)
        await api.create(namespaced("agentsessions", NAMESPACE), manifest)
    running = await _wait_all(api, "agentsessions", set(names_), _running, config.timeout_s)
    if len(running) < len(names_):
        return {"error": f"only {len(running)} of {len(names_)} sessions came up"}
    stop = asyncio.Event()
    async with GatewayClient(gateway.url) as client:
        loads = [ClientLoad(client, names.gateway_session(NAMESPACE, n), rate=1.0) for n in names_]
        tasks = [asyncio.create_task(load.watch()) for load in loads]
        tasks += [asyncio.create_task(load.run(stop)) for load in loads]
        await asyncio.sleep(2.0)
        began = time.monotonic()
        for name in names_:
            await api.patch(
                namespaced("agentsessions", NAMESPACE, name), {"spec": {"image": "refagent:v2"}}
            )
        wanted = {names.image_migration(n, 2) for n in names_}
        finished = await _wait_all(
            api,
            "agentmigrations",
            wanted,
            lambda b: (b.get("status") or {}).get("result"),
            config.timeout_s,
        )
        elapsed = time.monotonic() - began
        await asyncio.sleep(2.0)
        stop.set()
        answered = await asyncio.gather(*(load.wait_answered(60) for load in loads))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    results = [
        b
        for b in await api.list(namespaced("agentmigrations", NAMESPACE))
        if b["metadata"]["name"] in wanted
    ]
    verdicts = [load.verdict() for load in loads]
    reasons: dict[str, int] = {}
    for body in results:
        failed = [
            c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == "Failed"
        ]
        if failed and failed[0]["status"] == "True":
            reasons[failed[0]["reason"]] = reasons.get(failed[0]["reason"], 0) + 1
    return {
        "policy": LIVE_POLICY,
        "rolled_back_by_reason": reasons,
        "migrations": len(names_),
        "finished": len(finished),
        "succeeded": sum(
            1 for b in results if (b.get("status") or {}).get("result") == "Succeeded"
        ),
        "all_answered": all(answered),
        "sent": sum(len(load.sent) for load in loads),
        "lost": sum(v.lost for v in verdicts),
        "duplicated": sum(v.duplicated for v in verdicts),
        "reordered": sum(v.reordered for v in verdicts),
        "wall_s": round(elapsed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.kube.bench_operator", description=__doc__.split("\n\n")[0]
    )
    defaults = OperatorBenchConfig()
    parser.add_argument("--sessions", type=int, default=defaults.sessions)
    parser.add_argument("--bumped", type=int, default=defaults.bumped)
    parser.add_argument("--migrations", type=int, default=defaults.migrations)
    parser.add_argument("--workdir", type=Path, default=defaults.workdir)
    parser.add_argument("--idle-window", type=float, default=defaults.idle_window_s)
    parser.add_argument(
        "--created-suspended",
        action="store_true",
        help="create every session suspended (no pod) before the idle window",
    )
    parser.add_argument("--timeout", type=float, default=defaults.timeout_s)
    parser.add_argument("--settle", type=float, default=defaults.settle_s)
    parser.add_argument(
        "--suspended",
        action="store_true",
        help="suspend every session before the idle window (its cost per session)",
    )
    args = parser.parse_args()
    config = OperatorBenchConfig(
        sessions=args.sessions,
        bumped=min(args.bumped, args.sessions),
        migrations=args.migrations,
        workdir=args.workdir,
        idle_window_s=args.idle_window,
        suspended=args.suspended,
        created_suspended=args.created_suspended,
        timeout_s=args.timeout,
        settle_s=args.settle,
    )
    report = eventloop.run(run_operator_bench(config), terminate_gracefully=True)
    print(json.dumps(report, indent=2))
    missed = [name for name, t in report.get("targets", {}).items() if t["met"] is False]
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
