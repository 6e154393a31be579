"""``shadowpod bench rollout``: a fleet upgrade on a real control plane.

An AgentDeployment and ``sessions`` AgentSessions that follow it (no steps: the whole
fleet at once, at the operator's default caps — ``--max-concurrent-migrations`` 10,
``--max-concurrent-migrations-per-node`` 2); the operator runs as its own process
(``shadowpod operator``) against the cluster (by default `make cluster`'s real
kube-apiserver, etcd, scheduler and controllers), with a real gateway on this
machine. The sessions' pods are placed by the real scheduler on ``nodes`` hollow
nodes (``bench.hollow``; the real nodes are tainted ``NoSchedule`` for the run) whose
agents run in this process (``bench.hollow_agents``): a thousand agent processes do
not fit the benchmark's machine, a thousand agent runtimes do. Every move is a real
one — a shadow pod scheduled, its agent restoring and catching up through the
gateway, the fence, the drain, the new owner taking over at its new version and
migrating the agent's state — only the containers are not there.

Once every session is Running, ``probes`` of them take client load for ``window_s``
(the *before* figures); then the template's image is bumped and the rollout runs to
``Complete`` (or a halt, or ``timeout_s``). Measured:

- the rollout's wall time, from the bump to ``Complete``, and its moves' outcomes;
- migrations in flight over time (every ``sample_s``, from a watch: neither
  ``Queued`` nor finished), in the cluster and out of each source node, against the
  caps;
- the operator's RSS and CPU (``/proc``), before and during the rollout;
- API requests a second: the operator's own (its ``shadowpod_operator_requests_total``)
  and the API server's from every client (its ``apiserver_request_total``; none on
  the emulator), before and during;
- the probes' client latency p50/p99 before and during, and lost, duplicated and
  reordered messages (must be 0).

What was measured so far is written to ``out`` part by part (``"complete": false``
until the end). Nothing of the test suite is used (the shipped package never imports
tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shadowpod.bench.cluster import (
    DEFAULT_KUBECONFIG,
    Cluster,
    OperatorProcess,
    RequestCounts,
    create_paced,
    ensure_crds,
    percentiles,
    remove_namespace,
    require_kubeconfig,
    rss_mb,
    save_report,
    taint_nodes,
)
from shadowpod.bench.hollow import HollowNode
from shadowpod.bench.hollow_agents import HollowAgents, bench_agent
from shadowpod.bench.informer import follow
from shadowpod.bench.machine import MachineProbe
from shadowpod.client.gateway import GatewayClient
from shadowpod.kube import names
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.handlers import api_client
from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.local.gateway_process import GatewayProcess
from shadowpod.local.load import ClientLoad

# The operator's defaults, which the rollout runs under (and must never exceed).
MAX_CONCURRENT: Final = 10
MAX_PER_NODE: Final = 2
FINISHED: Final = frozenset({"Succeeded", "RolledBack", "Failed"})
DEPLOYMENT: Final = "fleet"
# A shadow on a loaded machine can take long to start: room before a move times out
# (a timed-out move would rightly halt the rollout, and the run says so).
POLICY: Final = {
    "drainGracePeriodSeconds": 2,
    "phaseTimeoutSeconds": 300,
    "maxDurationSeconds": 900,
}


@dataclass(frozen=True)
class RolloutBenchConfig:
    kubeconfig: Path = DEFAULT_KUBECONFIG
    sessions: int = 1000
    # Hollow nodes the sessions spread over: the per-node cap (2) over one node would
    # be the rollout's pace, not the cluster's cap (10).
    nodes: int = 5
    probes: int = 5
    rate: float = 1.0  # messages a second to each probe
    create_rate: float = 20.0
    window_s: float = 30.0
    sample_s: float = 1.0
    # Images only the hollow nodes run (the benchmark's agent, versions 1 and 2).
    image: str = "shadowpod-bench-agent:v1"
    target_image: str = "shadowpod-bench-agent:v2"
    workdir: Path = Path("/tmp/shadowpod-bench-rollout")
    out: Path | None = None
    up_timeout_s: float = 1800.0
    timeout_s: float = 1800.0
    # The emulator has no scheduler: there the hollow nodes bind their pods themselves.
    hollow_schedules: bool = False
    namespace: str = field(default_factory=lambda: f"rollout-{uuid.uuid4().hex[:6]}")


def _deployment(config: RolloutBenchConfig) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentDeployment",
        "metadata": {"name": DEPLOYMENT, "namespace": config.namespace},
        "spec": {
            # Requests, so that the scheduler spreads the pods over the hollow nodes
            # (with none, every node scores the same and most land on one, whose
            # per-node cap then sets the rollout's pace).
            "template": {
                "image": config.image,
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            },
            "migration": POLICY,
            # No steps: every session at once, at the caps (the pace is the queue's).
            "strategy": {
                "maxConcurrentMigrations": MAX_CONCURRENT,
                "maxConcurrentPerNode": MAX_PER_NODE,
            },
        },
    }


def _follower(config: RolloutBenchConfig, n: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": f"f{n:04d}", "namespace": config.namespace},
        "spec": {"deploymentRef": {"name": DEPLOYMENT}},
    }


def cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU seconds of a process, from /proc."""
    if pid is None:
        return None
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


@dataclass
class Migrations:
    """The namespace's migrations as a watch last showed them, sampled over time: how
    many were in flight (neither queued nor finished), in all and out of one node —
    each counted on its session's node, as the pacing queue counts it (a migration's
    status does not name its source's node)."""

    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, str | None] = field(default_factory=dict)  # session -> its node
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, all, most/node)
    most: int = 0
    most_per_node: int = 0

    def on_event(self, kind: str, body: dict[str, Any], _: float) -> None:
        if kind == "DELETED":
            self.bodies.pop(body["metadata"]["name"], None)
        else:
            self.bodies[body["metadata"]["name"]] = body

    def on_session(self, kind: str, body: dict[str, Any], _: float) -> None:
        name = body["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = (body.get("status") or {}).get("nodeName")

    def sample(self, at: float) -> None:
        running = [
            m
            for m in self.bodies.values()
            if (m.get("status") or {}).get("phase") not in (None, "Queued", *FINISHED)
        ]
        nodes = Counter(
            self.nodes.get(((m.get("spec") or {}).get("sessionRef") or {}).get("name", ""))
            for m in running
        )
        per_node = max((n for node, n in nodes.items() if node), default=0)
        self.samples.append((round(at, 1), len(running), per_node))
        self.most = max(self.most, len(running))
        self.most_per_node = max(self.most_per_node, per_node)

    def outcomes(self) -> dict[str, int]:
        return dict(
            Counter(
                str((m.get("status") or {}).get("result") or "unfinished")
                for m in self.bodies.values()
            )
        )


async def _phase(api: KubeApi, namespace: str) -> tuple[str | None, int, dict[str, Any]]:
    body = await api.get(namespaced("agentdeployments", namespace, DEPLOYMENT))
    status = (body or {}).get("status") or {}
    return status.get("phase"), int(status.get("revision") or 0), status


async def run_rollout_bench(config: RolloutBenchConfig) -> dict[str, Any]:
    require_kubeconfig(config.kubeconfig)
    probe = MachineProbe()
    probe.start()
    config.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "complete": False,
        "config": {k: str(v) for k, v in vars(config).items()},
        "caps": {"max_concurrent": MAX_CONCURRENT, "max_per_node": MAX_PER_NODE},
        "pods": f"on {config.nodes} hollow nodes (bench.hollow): placed by the scheduler, "
        "their agents' runtimes run in the benchmark's process (bench.hollow_agents), "
        "each on its own loopback address; the real nodes tainted NoSchedule",
        "load_average_before": os.getloadavg(),
    }
    gateway = GatewayProcess(config.workdir / "gateway", host="127.0.0.1")
    await gateway.start()
    migrations = Migrations()
    watches: list[asyncio.Task[None]] = []
    async with await api_client(str(config.kubeconfig)) as client:
        api = KubeApi(client)
        cluster = Cluster(api, config.namespace)
        operator = OperatorProcess(config.kubeconfig, config.namespace, config.workdir, gateway)
        result["crds_installed"] = await ensure_crds(api)
        await api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": config.namespace}},
        )
        result["tainted_nodes"] = await taint_nodes(api, on=True)
        agents = HollowAgents(
            api, {config.image: bench_agent(1), config.target_image: bench_agent(2)}
        )
        nodes = [
            HollowNode(
                api,
                f"hollow-{config.namespace}-{n}",
                frozenset(),
                schedules=config.hollow_schedules and n == 0,
                agents=agents,
            )
            for n in range(config.nodes)
        ]
        try:
            async with contextlib.AsyncExitStack() as stack:
                for node in nodes:
                    await stack.enter_async_context(node)
                for plural, handler in (
                    ("agentmigrations", migrations.on_event),
                    ("agentsessions", migrations.on_session),
                ):
                    path = namespaced(plural, config.namespace)
                    watches.append(
                        asyncio.create_task(follow(api, path, handler, breaks=cluster.watch_breaks))
                    )
                await operator.start()
                await asyncio.sleep(3.0)
                await _fleet(api, cluster, operator, gateway, migrations, config, result)
                result["hollow_nodes"] = {
                    node.name: {"failures": node.failures, "watch_breaks": node.breaks}
                    for node in nodes
                }
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await operator.stop()
            with contextlib.suppress(Exception):
                await taint_nodes(api, on=False)
            await remove_namespace(api, config.namespace)
            await gateway.stop()
    result["watch_breaks"] = cluster.watch_breaks
    result["load_average_after"] = os.getloadavg()
    result["machine"] = probe.report()
    result["complete"] = True
    save_report(config.out, result)
    return result


async def _fleet(
    api: KubeApi,
    cluster: Cluster,
    operator: OperatorProcess,
    gateway: GatewayProcess,
    migrations: Migrations,
    config: RolloutBenchConfig,
    result: dict[str, Any],
) -> None:
    namespace = config.namespace
    pid = None if operator.process is None else operator.process.pid

    async def counted() -> tuple[RequestCounts, float | None]:
        return await RequestCounts.now(cluster, operator.metrics_port), cpu_seconds(pid)

    await api.create(namespaced("agentdeployments", namespace), _deployment(config))
    began = time.monotonic()
    followers = [_follower(config, n) for n in range(config.sessions)]
    await create_paced(api, namespaced("agentsessions", namespace), followers, config.create_rate)
    result["fleet"] = {"sessions": config.sessions, "create_rate_per_s": config.create_rate}
    while time.monotonic() - began < config.up_timeout_s:
        phase, revision, status = await _phase(api, namespace)
        if phase == "Complete" and revision == 1:
            break
        await asyncio.sleep(2.0)
    else:
        result["fleet"]["error"] = (
            f"not every session Running within {config.up_timeout_s} s: {status.get('sessions')}"
        )
        save_report(config.out, result)
        return
    result["fleet"]["seconds_to_all_running"] = round(time.monotonic() - began, 1)
    result["fleet"]["load_average"] = os.getloadavg()
    save_report(config.out, result)

    probes = [f"f{n:04d}" for n in range(min(config.probes, config.sessions))]
    stop = asyncio.Event()
    async with GatewayClient(gateway.url) as client:
        loads = [
            ClientLoad(client, names.gateway_session(namespace, name), rate=config.rate)
            for name in probes
        ]
        watchers = [asyncio.create_task(load.watch()) for load in loads]
        senders = [asyncio.create_task(load.run(stop)) for load in loads]
        try:
            # Before: the fleet idle but for the probes' load.
            counts0, cpu0 = (
                await RequestCounts.now(cluster, operator.metrics_port),
                cpu_seconds(pid),
            )
            await asyncio.sleep(config.window_s)
            counts1, cpu1 = (
                await RequestCounts.now(cluster, operator.metrics_port),
                cpu_seconds(pid),
            )
            result["before"] = _window(counts0, counts1, cpu0, cpu1, pid)
            save_report(config.out, result)
            bumped = time.monotonic()
            await api.patch(
                namespaced("agentdeployments", namespace, DEPLOYMENT),
                {"spec": {"template": {"image": config.target_image}}},
            )
            rss: list[float] = []
            phase, status = None, {}
            while time.monotonic() - bumped < config.timeout_s:
                migrations.sample(time.monotonic() - bumped)
                if (now := rss_mb(pid)) is not None:
                    rss.append(now["rss"])
                phase, revision, status = await _phase(api, namespace)
                if revision == 2 and phase in ("Complete", "Halted"):
                    break
                await asyncio.sleep(config.sample_s)
            wall_s = time.monotonic() - bumped
            counts2, cpu2 = (
                await RequestCounts.now(cluster, operator.metrics_port),
                cpu_seconds(pid),
            )
            stop.set()
            await asyncio.gather(*senders)
            for load in loads:
                await load.wait_answered(60.0)
        finally:
            stop.set()
            for task in [*watchers, *senders]:
                task.cancel()
            await asyncio.gather(*watchers, *senders, return_exceptions=True)
    during = _window(counts1, counts2, cpu1, cpu2, pid)
    during["operator_rss_mb_max"] = max(rss, default=None)
    caps_kept = migrations.most <= MAX_CONCURRENT and migrations.most_per_node <= MAX_PER_NODE
    result["rollout"] = {
        "phase": phase,
        "halted": status.get("message") if phase == "Halted" else None,
        "wall_s": round(wall_s, 1),
        "sessions_per_minute": round(60 * config.sessions / wall_s, 1) if wall_s else None,
        "migrations": migrations.outcomes(),
        "in_flight_most": migrations.most,
        "in_flight_most_per_node": migrations.most_per_node,
        "caps_kept": caps_kept,
        "in_flight_over_time": migrations.samples,
        **during,
        "load_average": os.getloadavg(),
    }
    verdicts = [load.verdict() for load in loads]
    client_ok = sum(v.lost + v.duplicated + v.reordered for v in verdicts) == 0
    result["client"] = {
        "probes": len(loads),
        "rate_per_probe": config.rate,
        "latency_before_s": percentiles(
            [x for load in loads for x in load.latencies(lambda s: s.at < bumped)]
        ),
        "latency_during_s": percentiles(
            [x for load in loads for x in load.latencies(lambda s: bumped <= s.at)]
        ),
        "sent": sum(v.sent for v in verdicts),
        "lost": sum(v.lost for v in verdicts),
        "duplicated": sum(v.duplicated for v in verdicts),
        "reordered": sum(v.reordered for v in verdicts),
        "versions": dict(sum((Counter(v.versions) for v in verdicts), Counter())),
    }
    result["targets"] = {
        "rollout_complete": {"met": phase == "Complete"},
        "caps_kept": {"met": caps_kept},
        "nothing_lost_doubled_or_reordered": {"met": client_ok},
    }
    save_report(config.out, result)


def _window(
    before: RequestCounts,
    after: RequestCounts,
    cpu_before: float | None,
    cpu_after: float | None,
    pid: int | None,
) -> dict[str, Any]:
    seconds = after.seconds_since(before)
    by_resource = after.apiserver_rates(before)
    cpu = None
    if cpu_before is not None and cpu_after is not None:
        cpu = round(100 * (cpu_after - cpu_before) / seconds, 1)
    return {
        "window_s": round(seconds, 1),
        "operator_rss_mb": (rss_mb(pid) or {}).get("rss"),
        "operator_cpu_percent": cpu,
        "operator_api_requests_per_s": after.operator_rate(before, "api"),
        "operator_gateway_requests_per_s": after.operator_rate(before, "gateway"),
        "apiserver_requests_per_s_all_clients": round(sum(by_resource.values()), 2),
        "apiserver_by_resource": dict(list(by_resource.items())[:15]),
    }
