"""``shadowpod bench rollout``: a fleet upgrade on a real Kubernetes API server.

An AgentDeployment and ``sessions`` AgentSessions that follow it (no steps: the whole
fleet at once, at the operator's default caps — ``--max-concurrent-migrations`` 10,
``--max-concurrent-migrations-per-node`` 2); the operator runs as its own process
(``shadowpod operator``) against the cluster, with a real gateway on this machine where
the pods reach it, the sessions in the reference agent's images. Once every session is
Running, ``probes`` of them take client load for ``window_s`` (the *before* figures),
then the template's image is bumped and the rollout runs to ``Complete`` (or a halt, or
``timeout_s``). Measured:

- the rollout's wall time, from the bump to ``Complete``;
- migrations in flight over time (every ``sample_s``, from the API: neither ``Queued``
  nor finished), in the cluster and out of each source node, against the caps;
- the operator's RSS and CPU (``/proc``), before and during the rollout;
- the API server's requests a second (its ``apiserver_request_total``), before and
  during;
- the probes' client latency p50/p99 before and during, and lost, duplicated and
  reordered messages (must be 0).

Nothing of the test suite is used (the shipped package never imports tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shadowpod.bench.cluster import (
    DEFAULT_HOST,
    DEFAULT_KUBECONFIG,
    Cluster,
    OperatorProcess,
    ensure_crds,
    percentiles,
    rates,
    require_kubeconfig,
)
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
    gateway_host: str = DEFAULT_HOST
    sessions: int = 1000
    probes: int = 5
    rate: float = 1.0  # messages a second to each probe
    create_rate: float = 20.0
    window_s: float = 30.0
    sample_s: float = 0.5
    image: str = "shadowpod-refagent:v1"
    target_image: str = "shadowpod-refagent:v2"
    workdir: Path = Path("/tmp/shadowpod-bench-rollout")
    timeout_s: float = 1800.0
    namespace: str = field(default_factory=lambda: f"rollout-{uuid.uuid4().hex[:6]}")


def _deployment(config: RolloutBenchConfig) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentDeployment",
        "metadata": {"name": DEPLOYMENT, "namespace": config.namespace},
        "spec": {
            "template": {
                "image": config.image,
                "env": [{"name": "REFAGENT_HEARTBEAT_S", "value": "0"}],
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


class OperatorUsage:
    """RSS and CPU seconds of the operator's process, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ticks = os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float | None:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        return None

    def cpu_s(self) -> float | None:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / self.ticks
        return None


@dataclass
class InFlight:
    """Migrations neither queued nor finished, sampled over time."""

    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, all, most/node)
    most: int = 0
    most_per_node: int = 0
    finished: Counter[str] = field(default_factory=Counter)

    def sample(self, at: float, migrations: list[dict[str, Any]]) -> None:
        running = [
            m
            for m in migrations
            if (m.get("status") or {}).get("phase") not in (None, "Queued", *FINISHED)
        ]
        nodes = Counter(
            ((m.get("status") or {}).get("source") or {}).get("nodeName") for m in running
        )
        per_node = max((n for node, n in nodes.items() if node), default=0)
        self.samples.append((round(at, 2), len(running), per_node))
        self.most = max(self.most, len(running))
        self.most_per_node = max(self.most_per_node, per_node)
        self.finished = Counter(
            str((m.get("status") or {}).get("result"))
            for m in migrations
            if (m.get("status") or {}).get("phase") in FINISHED
        )


async def _phase(api: KubeApi, namespace: str) -> tuple[str | None, int]:
    body = await api.get(namespaced("agentdeployments", namespace, DEPLOYMENT))
    status = (body or {}).get("status") or {}
    return status.get("phase"), int(status.get("revision") or 0)


async def _until_phase(
    api: KubeApi, namespace: str, phases: set[str], revision: int, timeout_s: float
) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        phase, seen = await _phase(api, namespace)
        if phase in phases and seen == revision:
            return phase
        await asyncio.sleep(1.0)
    return None


async def run_rollout_bench(config: RolloutBenchConfig) -> dict[str, Any]:
    require_kubeconfig(config.kubeconfig)
    probe = MachineProbe()
    probe.start()
    config.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(config).items()},
        "caps": {"max_concurrent": MAX_CONCURRENT, "max_per_node": MAX_PER_NODE},
        "load_average_before": os.getloadavg(),
    }
    gateway = GatewayProcess(config.workdir / "gateway", host=config.gateway_host)
    await gateway.start()
    operator = OperatorProcess(config.kubeconfig, config.namespace, config.workdir, gateway)
    async with await api_client(str(config.kubeconfig)) as client:
        api = KubeApi(client)
        cluster = Cluster(api, config.namespace)
        result["crds_installed"] = await ensure_crds(api)
        await api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": config.namespace}},
        )
        try:
            await operator.start()
            assert operator.process is not None
            usage = OperatorUsage(operator.process.pid)
            result.update(await _fleet(api, cluster, gateway, usage, config))
        finally:
            await operator.stop()
            await _remove(api, config.namespace)
            await gateway.stop()
    result["load_average_after"] = os.getloadavg()
    result["machine"] = probe.report()
    return result


async def _fleet(
    api: KubeApi,
    cluster: Cluster,
    gateway: GatewayProcess,
    usage: OperatorUsage,
    config: RolloutBenchConfig,
) -> dict[str, Any]:
    namespace = config.namespace
    await api.create(namespaced("agentdeployments", namespace), _deployment(config))
    began = time.monotonic()
    for n in range(config.sessions):
        await api.create(namespaced("agentsessions", namespace), _follower(config, n))
        await asyncio.sleep(1.0 / config.create_rate)
    up = await _until_phase(api, namespace, {"Complete"}, 1, config.timeout_s)
    if up is None:
        return {"error": f"the {config.sessions} sessions were not all Running in time"}
    out: dict[str, Any] = {"fleet_up_s": round(time.monotonic() - began, 1)}
    _keep(config, out)
    probes = [f"f{n:04d}" for n in range(min(config.probes, config.sessions))]
    stop = asyncio.Event()
    async with GatewayClient(gateway.url) as client:
        loads = [
            ClientLoad(client, names.gateway_session(namespace, name), rate=config.rate)
            for name in probes
        ]
        tasks = [asyncio.create_task(load.watch()) for load in loads]
        tasks += [asyncio.create_task(load.run(stop)) for load in loads]
        try:
            # Before: the fleet idle but for the probes' load.
            start = time.monotonic()
            cpu0, requests0 = usage.cpu_s(), await cluster.metrics()
            await asyncio.sleep(config.window_s)
            before_s = time.monotonic() - start
            cpu1, requests1 = usage.cpu_s(), await cluster.metrics()
            out["before"] = {
                "window_s": round(before_s, 1),
                "operator_rss_mb": usage.rss_mb(),
                "operator_cpu_percent": _cpu(cpu0, cpu1, before_s),
                "api_requests_per_s": round(sum(rates(requests0, requests1, before_s).values()), 2),
            }
            _keep(config, out)
            bumped = time.monotonic()
            await api.patch(
                namespaced("agentdeployments", namespace, DEPLOYMENT),
                {"spec": {"template": {"image": config.target_image}}},
            )
            flight = InFlight()
            rss: list[float] = []
            phase = None
            while time.monotonic() - bumped < config.timeout_s:
                flight.sample(
                    time.monotonic() - bumped,
                    await api.list(namespaced("agentmigrations", namespace)),
                )
                if (mb := usage.rss_mb()) is not None:
                    rss.append(mb)
                phase, revision = await _phase(api, namespace)
                if revision == 2 and phase in ("Complete", "Halted"):
                    break
                await asyncio.sleep(config.sample_s)
            during_s = time.monotonic() - bumped
            cpu2, requests2 = usage.cpu_s(), await cluster.metrics()
            stop.set()
            await asyncio.gather(*tasks[len(loads) :])
            for load in loads:
                await load.wait_answered(60.0)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    verdicts = [load.verdict() for load in loads]
    out["rollout"] = {
        "phase": phase,
        "wall_s": round(during_s, 1),
        "migrations": dict(flight.finished),
        "in_flight_most": flight.most,
        "in_flight_most_per_node": flight.most_per_node,
        "caps_kept": flight.most <= MAX_CONCURRENT and flight.most_per_node <= MAX_PER_NODE,
        "in_flight_over_time": flight.samples,
        "operator_rss_mb_max": max(rss, default=None),
        "operator_cpu_percent": _cpu(cpu1, cpu2, during_s),
        "api_requests_per_s": round(sum(rates(requests1, requests2, during_s).values()), 2),
        "api_requests_per_s_by_resource": rates(requests1, requests2, during_s),
    }
    out["client"] = {
        "probes": len(loads),
        "rate_per_probe": config.rate,
        "latency_before_s": percentiles(
            [x for load in loads for x in load.latencies(lambda s: s.at < bumped)]
        ),
        "latency_during_s": percentiles(
            [x for load in loads for x in load.latencies(lambda s: s.at >= bumped)]
        ),
        "sent": sum(v.sent for v in verdicts),
        "lost": sum(v.lost for v in verdicts),
        "duplicated": sum(v.duplicated for v in verdicts),
        "reordered": sum(v.reordered for v in verdicts),
    }
    _keep(config, out)
    client_ok = sum(v.lost + v.duplicated + v.reordered for v in verdicts) == 0
    out["targets"] = {
        "rollout_complete": {"met": phase == "Complete"},
        "caps_kept": {"met": out["rollout"]["caps_kept"]},
        "nothing_lost_doubled_or_reordered": {"met": client_ok},
    }
    return out


def _keep(config: RolloutBenchConfig, out: dict[str, Any]) -> None:
    """What is measured so far, in the work directory: a run stopped midway keeps it."""
    (config.workdir / "report-partial.json").write_text(json.dumps(out, indent=2))


def _cpu(before: float | None, after: float | None, seconds: float) -> float | None:
    if before is None or after is None or seconds <= 0:
        return None
    return round(100 * (after - before) / seconds, 1)


async def _remove(api: KubeApi, namespace: str) -> None:
    """The operator is stopped: its finalizers come off what it left, then the
    namespace goes (the garbage collector takes the pods)."""
    with contextlib.suppress(Exception):
        for plural in ("agentsessions", "agentmigrations"):
            for item in await api.list(namespaced(plural, namespace)):
                if item["metadata"].get("finalizers"):
                    await api.patch(
                        namespaced(plural, namespace, item["metadata"]["name"]),
                        {"metadata": {"finalizers": None}},
                    )
        await api.delete(f"/api/v1/namespaces/{namespace}")
