"""``shadowpod bench cluster``: the operator against a real Kubernetes API server.

The operator runs as its own process (``shadowpod operator --kubeconfig``) against a
real cluster (by default `make cluster`'s: a real kube-apiserver and etcd, real
kubelets with containerd), with a real gateway on this machine listening where the
cluster's pods reach it; the sessions run the reference agent's image
(``shadowpod-refagent:v1``) in real containers. Nothing of the test suite is used.
Measured, in a namespace of its own:

- **reaction**: ``sessions`` AgentSessions created at ``rate`` a second; for each, the
  time to its owner Pod's creation (the Pod's ADDED event on a watch) and to the
  session's ``Running`` (the kubelet started the container and the agent took the
  session over); then each one's ``spec.image`` changed at the same rate, and the time
  to the AgentMigration the operator creates for it. The bump names an image no node
  has (``bump_image``): the migrations fail at the shadow's image pull instead of
  starting ``sessions`` shadow agents at once on this machine; the figure is the
  operator's reaction to the change, which comes before any shadow exists.
- **idle cost**: the API requests a second the operator makes for idle sessions, from
  the API server's own ``apiserver_request_total`` (its ``/metrics``): the requests
  counted over ``window_s`` with the operator running, minus those counted over the
  same window with it stopped (the kubelets, the controllers, the scheduler and
  kube-proxy go on at their own rate; requests with no resource — probes, the
  scrapes themselves — are left out); and the ``shadowpod.dev`` group's alone, which
  only the operator touches. Once at ``sessions`` (every owner pod running) and once
  at ``idle_sessions``: sessions beyond what the nodes can run have their owner pod
  Pending (unschedulable), so that figure is the operator's request cost for that
  many sessions of which only some run — said in the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from prometheus_client.parser import text_string_to_metric_families

from shadowpod.bench.machine import MachineProbe
from shadowpod.kube import names
from shadowpod.kube.api import KubeApi, KubeError, namespaced
from shadowpod.kube.handlers import api_client
from shadowpod.kube.models.crd import manifests
from shadowpod.kube.models.v1alpha1 import API_VERSION, GROUP, RESOURCES
from shadowpod.local.gateway_process import GatewayProcess, free_port

DEFAULT_KUBECONFIG: Final = Path("/var/lib/shadowpod-cluster/admin.kubeconfig")
# `make cluster`'s API server address: on this machine's lo, routed to from the pods.
DEFAULT_HOST: Final = "10.87.0.1"


@dataclass(frozen=True)
class ClusterBenchConfig:
    kubeconfig: Path = DEFAULT_KUBECONFIG
    gateway_host: str = DEFAULT_HOST
    sessions: int = 100
    rate: float = 10.0
    idle_sessions: int = 1000
    window_s: float = 60.0
    settle_s: float = 20.0
    image: str = "shadowpod-refagent:v1"
    bump_image: str = "shadowpod-refagent:no-such-tag"
    workdir: Path = Path("/tmp/shadowpod-bench-cluster")
    timeout_s: float = 600.0
    namespace: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex[:6]}")


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
        "max": round(ordered[-1], 3),
        "n": len(ordered),
    }


def request_counts(metrics_text: str) -> dict[tuple[str, str, str], float]:
    """``apiserver_request_total`` summed by (group, resource, verb), without the
    requests that name no resource (health probes, /metrics)."""
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            if not labels.get("resource"):
                continue
            key = (labels.get("group", ""), labels["resource"], labels.get("verb", ""))
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def rates(
    before: dict[tuple[str, str, str], float],
    after: dict[tuple[str, str, str], float],
    seconds: float,
) -> dict[str, float]:
    """Requests a second between two scrapes, by ``group/resource verb``."""
    out: dict[str, float] = {}
    for key, value in after.items():
        delta = value - before.get(key, 0.0)
        if delta > 0:
            group, resource, verb = key
            out[f"{group or 'core'}/{resource} {verb}"] = round(delta / seconds, 4)
    return dict(sorted(out.items(), key=lambda item: -item[1]))


class Cluster:
    """The few calls the benchmark makes, through the operator's own client."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    async def metrics(self) -> dict[tuple[str, str, str], float]:
        response = await self.api.api.call_api(
            "/metrics",
            "GET",
            header_params={"Accept": "text/plain"},
            _preload_content=False,
            _return_http_data_only=True,
            auth_settings=["BearerToken"],
        )
        return request_counts(await response.text())

    async def watch(
        self, plural: str, on_event: Callable[[str, dict[str, Any], float], None]
    ) -> None:
        """Every event of ``plural`` in the namespace, with the monotonic time it came,
        until cancelled (a watch the server ends is taken up again)."""
        version = ""
        while True:
            query = [("watch", "1"), ("timeoutSeconds", "600"), ("allowWatchBookmarks", "false")]
            if version:
                query.append(("resourceVersion", version))
            response = await self.api.api.call_api(
                namespaced(plural, self.namespace),
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=900,
                auth_settings=["BearerToken"],
            )
            async with contextlib.aclosing(_lines(response)) as lines:
                async for line in lines:
                    event = json.loads(line)
                    body = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        version = ""  # too old: start from now
                        break
                    version = (body.get("metadata") or {}).get("resourceVersion", version)
                    on_event(event["type"], body, time.monotonic())


async def _lines(response: Any) -> AsyncGenerator[bytes]:
    try:
        while line := await response.content.readline():
            if line.strip():
                yield line
    finally:
        response.release()


def _session(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": name},
        "spec": {"image": image, "migration": {"drainGracePeriodSeconds": 2}},
    }


class Timeline:
    """When each session's owner pod, Running status and image migration first
    appeared (monotonic times), from the watches."""

    def __init__(self) -> None:
        self.owner_pod: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.migration: dict[str, float] = {}
        self.migration_ended: dict[str, str] = {}

    def on_pod(self, kind: str, body: dict[str, Any], at: float) -> None:
        labels = (body.get("metadata") or {}).get("labels") or {}
        session = labels.get(names.SESSION_LABEL)
        if kind == "ADDED" and session and labels.get(names.ROLE_LABEL) == names.OWNER_ROLE:
            self.owner_pod.setdefault(session, at)

    def on_session(self, _: str, body: dict[str, Any], at: float) -> None:
        if (body.get("status") or {}).get("phase") == "Running":
            self.running.setdefault(body["metadata"]["name"], at)

    def on_migration(self, kind: str, body: dict[str, Any], at: float) -> None:
        if kind == "ADDED":
            self.migration.setdefault(body["metadata"]["name"], at)
        result = (body.get("status") or {}).get("result")
        if result:
            self.migration_ended[body["metadata"]["name"]] = result


async def _until(what: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


class OperatorProcess:
    def __init__(self, config: ClusterBenchConfig, gateway: GatewayProcess) -> None:
        self.config = config
        self.gateway = gateway
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        log = self.config.workdir / "operator.log"
        with log.open("ab") as sink:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shadowpod", "operator",
                "--kubeconfig", str(self.config.kubeconfig),
                "-n", self.config.namespace,
                "--gateway-url", self.gateway.url,
                "--control-token-file", str(self.gateway.workdir / "control-token"),
                "--metrics-host", "127.0.0.1",
                "--metrics-port", str(free_port()),
                "--log-level", "warning",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def ensure_crds(api: KubeApi, timeout_s: float = 60.0) -> list[str]:
    """The operator's CRDs where the cluster has none (a fresh `make cluster`), each
    Established; those there already are left as they are. The names installed."""
    installed = []
    for text in manifests(RESOURCES).values():
        body = yaml.safe_load(text)
        name = body["metadata"]["name"]
        if await api.get(f"{CRDS}/{name}") is None:
            await api.create(CRDS, body)
            installed.append(name)

        def established(crd: dict[str, Any] | None) -> bool:
            conditions = ((crd or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        deadline = time.monotonic() + timeout_s
        while not established(await api.get(f"{CRDS}/{name}")):
            if time.monotonic() > deadline:
                raise KubeError(504, "Timeout", f"CRD {name} not Established in {timeout_s} s")
            await asyncio.sleep(0.5)
    return installed


async def _idle_cost(
    cluster: Cluster, operator: OperatorProcess, config: ClusterBenchConfig, sessions: int
) -> dict[str, Any]:
    """Requests a second with the operator running, then stopped, over one window each."""
    await asyncio.sleep(config.settle_s)
    before = await cluster.metrics()
    await asyncio.sleep(config.window_s)
    running = rates(before, await cluster.metrics(), config.window_s)
    await operator.stop()
    # Its watches end as it stops, and are counted then: not in the next window.
    await asyncio.sleep(5.0)
    before = await cluster.metrics()
    await asyncio.sleep(config.window_s)
    stopped = rates(before, await cluster.metrics(), config.window_s)
    await operator.start()
    total_running, total_stopped = sum(running.values()), sum(stopped.values())
    ours = {k: v for k, v in running.items() if k.startswith(f"{GROUP}/")}
    attributed = max(0.0, total_running - total_stopped)
    return {
        "sessions": sessions,
        "window_s": config.window_s,
        "requests_per_s_operator_running": round(total_running, 3),
        "requests_per_s_operator_stopped": round(total_stopped, 3),
        "operator_requests_per_s": round(attributed, 3),
        "operator_requests_per_s_per_session": round(attributed / sessions, 5),
        "shadowpod_group_requests_per_s": round(sum(ours.values()), 3),
        "by_resource_operator_running": running,
        "by_resource_operator_stopped": stopped,
    }


async def run_cluster_bench(config: ClusterBenchConfig) -> dict[str, Any]:
    if not config.kubeconfig.is_file():
        raise FileNotFoundError(
            f"no kubeconfig at {config.kubeconfig}: start a cluster (`make cluster`) or "
            "pass --kubeconfig"
        )
    probe = MachineProbe()
    probe.start()
    config.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(config).items()},
        "load_average_before": os.getloadavg(),
    }
    gateway = GatewayProcess(config.workdir / "gateway", host=config.gateway_host)
    await gateway.start()
    operator = OperatorProcess(config, gateway)
    timeline = Timeline()
    watches: list[asyncio.Task[None]] = []
    async with await api_client(str(config.kubeconfig)) as client:
        api = KubeApi(client)
        cluster = Cluster(api, config.namespace)
        result["crds_installed"] = await ensure_crds(api)
        await api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": config.namespace}},
        )
        try:
            for plural, handler in (
                ("pods", timeline.on_pod),
                ("agentsessions", timeline.on_session),
                ("agentmigrations", timeline.on_migration),
            ):
                watches.append(asyncio.create_task(cluster.watch(plural, handler)))
            await operator.start()
            await asyncio.sleep(3.0)
            result["reaction"] = await _reaction(api, timeline, config)
            result["idle"] = [await _idle_cost(cluster, operator, config, config.sessions)]
            if config.idle_sessions > config.sessions:
                await _create(api, config, range(config.sessions, config.idle_sessions), 50.0)
                everyone = {f"s{i:04d}" for i in range(config.idle_sessions)}
                await _until(lambda: everyone <= timeline.owner_pod.keys(), config.timeout_s)
                idle = await _idle_cost(cluster, operator, config, config.idle_sessions)
                pods = await api.list(namespaced("pods", config.namespace))
                idle["owner_pods_running"] = sum(
                    1 for p in pods if (p.get("status") or {}).get("phase") == "Running"
                )
                idle["owner_pods_pending"] = sum(
                    1 for p in pods if (p.get("status") or {}).get("phase") == "Pending"
                )
                result["idle"].append(idle)
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await operator.stop()
            await _remove(api, config.namespace)
            await gateway.stop()
    result["load_average_after"] = os.getloadavg()
    result["machine"] = probe.report()
    return result


async def _create(api: KubeApi, config: ClusterBenchConfig, numbers: range, rate: float) -> None:
    began = time.monotonic()
    for n, i in enumerate(numbers):
        await asyncio.sleep(max(0.0, began + n / rate - time.monotonic()))
        await api.create(
            namespaced("agentsessions", config.namespace), _session(f"s{i:04d}", config.image)
        )


async def _reaction(api: KubeApi, timeline: Timeline, config: ClusterBenchConfig) -> dict[str, Any]:
    names_ = [f"s{i:04d}" for i in range(config.sessions)]
    created: dict[str, float] = {}
    began = time.monotonic()
    for n, name in enumerate(names_):
        await asyncio.sleep(max(0.0, began + n / config.rate - time.monotonic()))
        await api.create(
            namespaced("agentsessions", config.namespace), _session(name, config.image)
        )
        created[name] = time.monotonic()
    wanted = set(names_)
    all_running = await _until(lambda: wanted <= timeline.running.keys(), config.timeout_s)
    bumped: dict[str, float] = {}
    began = time.monotonic()
    for n, name in enumerate(names_):
        await asyncio.sleep(max(0.0, began + n / config.rate - time.monotonic()))
        await api.patch(
            namespaced("agentsessions", config.namespace, name),
            {"spec": {"image": config.bump_image}},
        )
        bumped[name] = time.monotonic()
    migrations = {names.image_migration(n, 2): n for n in names_}
    await _until(lambda: migrations.keys() <= timeline.migration.keys(), 120.0)
    # The moves end (the shadows' image cannot be pulled, or they cannot be placed and
    # time out) before the sessions are idle.
    await _until(lambda: migrations.keys() <= timeline.migration_ended.keys(), 180.0)
    # Back to the image they run, so that the idle windows find them idle (the failed
    # moves leave them on v1; the change makes the operator settle them, not move).
    for name in names_:
        await api.patch(
            namespaced("agentsessions", config.namespace, name),
            {"spec": {"image": config.image}},
        )
    ended: dict[str, int] = {}
    for m in migrations:
        outcome = timeline.migration_ended.get(m, "unfinished")
        ended[outcome] = ended.get(outcome, 0) + 1
    return {
        "sessions": config.sessions,
        "rate_per_s": config.rate,
        "bump_image": config.bump_image,
        "migrations_ended": ended,
        "all_running": all_running,
        "create_to_owner_pod_s": percentiles(
            [timeline.owner_pod[n] - created[n] for n in names_ if n in timeline.owner_pod]
        ),
        "create_to_running_s": percentiles(
            [timeline.running[n] - created[n] for n in names_ if n in timeline.running]
        ),
        "image_change_to_migration_s": percentiles(
            [
                timeline.migration[m] - bumped[n]
                for m, n in migrations.items()
                if m in timeline.migration
            ]
        ),
    }


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
