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
  to the AgentMigration the operator creates for it. By default the bump names an
  image no node has (``bump_image``): the migrations fail at the shadow's image pull
  instead of starting ``sessions`` shadow agents on this machine; the figure is the
  operator's reaction to the change, which comes before any shadow exists. Given an
  image the nodes have (``shadowpod-refagent:v2``), the sessions move live for real,
  and the moves' times are measured too (``migration_times``): the engine's start to
  its end, the change to the end (the wait under the operator's caps included), the
  Fencing phase.
- **idle cost**: the API requests a second the operator makes for idle sessions, from
  the API server's own ``apiserver_request_total`` (its ``/metrics``): the requests
  counted over ``window_s`` with the operator running, minus those counted over the
  same window with it stopped (the kubelets, the controllers, the scheduler and
  kube-proxy go on at their own rate; requests with no resource — probes, the
  scrapes themselves — are left out); and the ``shadowpod.dev`` group's alone, which
  only the operator touches. Once at ``sessions``, every owner pod running, before
  any move (the image change comes after it); and once at ``idle_sessions``: the
  sessions beyond ``sessions`` are made with every node tainted ``NoSchedule``, so
  their owner pods stay Pending while the first ones keep running — that figure is
  the operator's request cost for that many sessions of which only ``sessions`` run,
  said in the report.

Each part is written to ``out`` as soon as it is measured (``"complete": false``
until the end), so that a run stopped part way keeps what it measured.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shadowpod.bench.informer import OnEvent, follow, list_all
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
# Where `make cluster` keeps its components' pid files.
CLUSTER_RUN: Final = Path("/var/lib/shadowpod-cluster/run")


PARTS: Final = frozenset({"idle", "image-change", "idle-many"})


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
    # Which parts run, in this order (creation always: the others need its sessions).
    parts: frozenset[str] = PARTS
    # Where the report is written as each part is measured (a run stopped part way
    # keeps what it measured; ``"complete": false`` until the end).
    out: Path | None = None
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


def rss_mb(pid: int | None) -> dict[str, float] | None:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), in MB."""
    if pid is None:
        return None
    found: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found["rss" if key == "VmRSS" else "peak"] = round(int(value.split()[0]) / 1024, 1)
    return found or None


def cluster_pid(component: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((CLUSTER_RUN / f"{component}.pid").read_text().strip())
    return None


def operator_requests(metrics_text: str) -> dict[str, float]:
    """``shadowpod_operator_requests_total`` by ``to`` (api, gateway)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "shadowpod_operator_requests_total":
                found[sample.labels["to"]] = sample.value
    return found


async def scrape_operator(port: int) -> dict[str, float]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(30)) as r,
    ):
        return operator_requests(await r.text())


@dataclass(frozen=True)
class RequestCounts:
    """Request counters at one moment: the API server's by resource (none where it has
    no /metrics: the emulator) and the operator's own by where they went (api,
    gateway). Two of them give the rates between."""

    at: float
    apiserver: dict[tuple[str, str, str], float]
    operator: dict[str, float]

    @classmethod
    async def now(cls, cluster: Cluster, metrics_port: int) -> RequestCounts:
        apiserver = await apiserver_counts(cluster)
        return cls(time.monotonic(), apiserver, await scrape_operator(metrics_port))

    def seconds_since(self, before: RequestCounts) -> float:
        return max(self.at - before.at, 1e-9)

    def apiserver_rates(self, before: RequestCounts) -> dict[str, float]:
        return rates(before.apiserver, self.apiserver, self.seconds_since(before))

    def operator_rate(self, before: RequestCounts, to: str) -> float:
        delta = self.operator.get(to, 0) - before.operator.get(to, 0)
        return round(delta / self.seconds_since(before), 4)


async def apiserver_counts(cluster: Cluster) -> dict[tuple[str, str, str], float]:
    """The API server's request counts; none where it has no /metrics (the emulator)."""
    try:
        return await cluster.metrics()
    # The client's ApiException (which this layer may not import) or a dropped connection.
    except Exception:  # noqa: BLE001
        return {}


class Cluster:
    """The few calls the benchmark makes, through the operator's own client."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.watch_breaks: dict[str, int] = {}

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

    async def watch(self, plural: str, on_event: OnEvent) -> None:
        """Every object of ``plural`` in the namespace then every change, with the
        monotonic time it came, until cancelled (``follow``: a watch that breaks is taken
        up where it stopped; one whose version the server no longer keeps lists again,
        its objects given as ``LISTED``, not as new). Each break is counted in
        ``watch_breaks``."""
        await follow(
            self.api, namespaced(plural, self.namespace), on_event, breaks=self.watch_breaks
        )


def _session(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": name},
        "spec": {"image": image, "migration": {"drainGracePeriodSeconds": 2}},
    }


class Timeline:
    """When each session's owner pod, Running status and image migration first
    appeared (monotonic times), from the watches.

    Only what a watch delivered as it happened is timed: an object a watch's (re)list
    found (``LISTED``: at the start, or after a break longer than the server keeps
    changes) was seen later than it changed, so it is not — the figures taken from the
    API server's own timestamps still count it."""

    def __init__(self) -> None:
        self.owner_pod: dict[str, float] = {}
        # The owner pod's creationTimestamp (the API server's, to the second): a check
        # on the watch's times that no watch break can skew.
        self.owner_pod_created: dict[str, str] = {}
        self.running: dict[str, float] = {}
        self.migration: dict[str, float] = {}
        self.migration_ended: dict[str, str] = {}

    def on_pod(self, kind: str, body: dict[str, Any], at: float) -> None:
        labels = (body.get("metadata") or {}).get("labels") or {}
        session = labels.get(names.SESSION_LABEL)
        if not session or labels.get(names.ROLE_LABEL) != names.OWNER_ROLE:
            return
        if kind == "ADDED":
            self.owner_pod.setdefault(session, at)
        if kind in ("ADDED", "LISTED"):
            created = (body.get("metadata") or {}).get("creationTimestamp")
            if created:
                self.owner_pod_created.setdefault(session, created)

    def on_session(self, kind: str, body: dict[str, Any], at: float) -> None:
        if kind in ("ADDED", "MODIFIED") and (body.get("status") or {}).get("phase") == "Running":
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
    """``shadowpod operator`` as its own process, watching ``namespace``, its log in
    ``workdir``, its metrics on ``metrics_port``."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        workdir: Path,
        gateway: GatewayProcess,
        *,
        reconcile_interval_s: float | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.workdir = workdir
        self.gateway = gateway
        self.reconcile_interval_s = reconcile_interval_s
        self.metrics_port = free_port()
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        log = self.workdir / "operator.log"
        interval = (
            []
            if self.reconcile_interval_s is None
            else ["--reconcile-interval", str(self.reconcile_interval_s)]
        )
        with log.open("ab") as sink:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shadowpod", "operator",
                "--kubeconfig", str(self.kubeconfig),
                "-n", self.namespace,
                "--gateway-url", self.gateway.url,
                "--control-token-file", str(self.gateway.workdir / "control-token"),
                "--metrics-host", "127.0.0.1",
                "--metrics-port", str(self.metrics_port),
                "--log-level", "warning",
                *interval,
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
    cluster: Cluster,
    operator: OperatorProcess,
    config: ClusterBenchConfig,
    sessions: int,
    *,
    restart: bool = True,
) -> dict[str, Any]:
    """Requests a second with the operator running, then stopped, over one window each
    (then started again, if ``restart``)."""
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
    if restart:
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


def _save(config: ClusterBenchConfig, result: dict[str, Any]) -> None:
    save_report(config.out, result)


def save_report(out: Path | None, result: dict[str, Any]) -> None:
    """The report so far, to ``out`` (replaced whole, never left half written)."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(out)


# Put on every node while the sessions beyond ``sessions`` are made: their owner pods
# stay Pending (unschedulable), while the running ones keep running. A taint, not a
# cordon: the operator moves sessions off a cordoned node.
FULL_TAINT: Final = {"key": "shadowpod.dev/bench-full", "value": "true", "effect": "NoSchedule"}


async def taint_nodes(api: KubeApi, *, on: bool) -> list[str]:
    tainted = []
    for node in await api.list("/api/v1/nodes"):
        taints = [t for t in (node["spec"].get("taints") or []) if t["key"] != FULL_TAINT["key"]]
        if on:
            taints.append(FULL_TAINT)
        await api.patch(f"/api/v1/nodes/{node['metadata']['name']}", {"spec": {"taints": taints}})
        tainted.append(node["metadata"]["name"])
    return tainted


async def create_paced(
    api: KubeApi,
    path: str,
    bodies: list[dict[str, Any]],
    rate: float,
    created: dict[str, float] | None = None,
) -> None:
    """``bodies`` created at ``path``, ``rate`` a second (a few requests in flight, so a
    slow answer does not slow the pace); when each was made, by name, in ``created``."""
    began = time.monotonic()
    limit = asyncio.Semaphore(8)

    async def one(body: dict[str, Any]) -> None:
        async with limit:
            await api.create(path, body)
            if created is not None:
                created[body["metadata"]["name"]] = time.monotonic()

    tasks = []
    for n, body in enumerate(bodies):
        await asyncio.sleep(max(0.0, began + n / rate - time.monotonic()))
        tasks.append(asyncio.create_task(one(body)))
    await asyncio.gather(*tasks)


def require_kubeconfig(path: Path) -> None:
    """A benchmark on a real cluster starts only where one answers to ``path``."""
    if not path.is_file():
        raise FileNotFoundError(
            f"no kubeconfig at {path}: start a cluster (`make cluster`) or pass --kubeconfig"
        )


async def run_cluster_bench(config: ClusterBenchConfig) -> dict[str, Any]:
    require_kubeconfig(config.kubeconfig)
    probe = MachineProbe()
    probe.start()
    config.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "complete": False,
        "config": {k: str(v) for k, v in vars(config).items()},
        "load_average_before": os.getloadavg(),
    }
    gateway = GatewayProcess(config.workdir / "gateway", host=config.gateway_host)
    await gateway.start()
    operator = OperatorProcess(config.kubeconfig, config.namespace, config.workdir, gateway)
    timeline = Timeline()
    watches: list[asyncio.Task[None]] = []
    tainted = False

    def save(part: str) -> None:
        result.setdefault("load_average_after_part", {})[part] = os.getloadavg()
        result["watch_breaks"] = cluster.watch_breaks
        _save(config, result)

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
            result["reaction"] = await _creation(api, timeline, config)
            save("creation")
            result["idle"] = []
            if "idle" in config.parts:
                # Idle before any move: every session Running (those that got there).
                result["idle"].append(await _idle_cost(cluster, operator, config, config.sessions))
                save("idle")
            if "image-change" in config.parts:
                result["reaction"].update(await _image_change(api, timeline, config))
                save("image_change")
            if "idle-many" in config.parts and config.idle_sessions > config.sessions:
                tainted = True
                result["tainted_nodes"] = await taint_nodes(api, on=True)
                await _create(api, config, range(config.sessions, config.idle_sessions), 20.0)
                everyone = {f"s{i:04d}" for i in range(config.idle_sessions)}
                made = await _until(lambda: everyone <= timeline.owner_pod.keys(), config.timeout_s)
                idle = await _idle_cost(
                    cluster, operator, config, config.idle_sessions, restart=False
                )
                idle["every_owner_pod_made"] = made
                pods = (await list_all(api, namespaced("pods", config.namespace)))[0]
                for phase in ("Running", "Pending"):
                    idle[f"pods_{phase.lower()}"] = sum(
                        1 for p in pods if (p.get("status") or {}).get("phase") == phase
                    )
                result["idle"].append(idle)
                save("idle_many")
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await operator.stop()
            if tainted:
                with contextlib.suppress(Exception):
                    await taint_nodes(api, on=False)
            await remove_namespace(api, config.namespace)
            await gateway.stop()
    result["load_average_after"] = os.getloadavg()
    result["machine"] = probe.report()
    result["complete"] = True
    _save(config, result)
    return result


async def _create(api: KubeApi, config: ClusterBenchConfig, numbers: range, rate: float) -> None:
    began = time.monotonic()
    for n, i in enumerate(numbers):
        await asyncio.sleep(max(0.0, began + n / rate - time.monotonic()))
        await api.create(
            namespaced("agentsessions", config.namespace), _session(f"s{i:04d}", config.image)
        )


async def _creation(api: KubeApi, timeline: Timeline, config: ClusterBenchConfig) -> dict[str, Any]:
    """``sessions`` AgentSessions made at ``rate`` a second; until each is Running."""
    names_ = [f"s{i:04d}" for i in range(config.sessions)]
    created: dict[str, float] = {}
    stamped: dict[str, str] = {}
    began = time.monotonic()
    for n, name in enumerate(names_):
        await asyncio.sleep(max(0.0, began + n / config.rate - time.monotonic()))
        made = await api.create(
            namespaced("agentsessions", config.namespace), _session(name, config.image)
        )
        created[name] = time.monotonic()
        stamped[name] = made["metadata"]["creationTimestamp"]
    ready = await _ready_times(api, config, set(names_))
    running_by_condition = [ready[n] - seconds_of(stamped[n]) for n in names_ if n in ready]
    return {
        "sessions": config.sessions,
        "rate_per_s": config.rate,
        "all_running": len(ready) == len(names_),
        "create_to_owner_pod_s": percentiles(
            [timeline.owner_pod[n] - created[n] for n in names_ if n in timeline.owner_pod]
        ),
        "create_to_owner_pod_by_creation_timestamps_s": percentiles(
            [
                seconds_of(timeline.owner_pod_created[n]) - seconds_of(stamped[n])
                for n in names_
                if n in timeline.owner_pod_created
            ]
        ),
        "create_to_running_s": percentiles(
            [timeline.running[n] - created[n] for n in names_ if n in timeline.running]
        ),
        "create_to_running_by_ready_condition_s": percentiles(running_by_condition),
    }


async def _ready_times(
    api: KubeApi, config: ClusterBenchConfig, wanted: set[str]
) -> dict[str, float]:
    """When each session of ``wanted`` became Running, from its own ``Ready``
    condition's lastTransitionTime (the API server's clock, to the second), polled
    every 5 s until all are or ``timeout_s`` is up. Not from the watch: in two runs on
    the loaded machine the benchmark's AgentSession watch saw no Running at all, while
    every session said Running."""
    deadline = time.monotonic() + config.timeout_s
    ready: dict[str, float] = {}
    while True:
        for body in (await list_all(api, namespaced("agentsessions", config.namespace)))[0]:
            name = body["metadata"]["name"]
            status = body.get("status") or {}
            if name not in wanted or name in ready or status.get("phase") != "Running":
                continue
            for condition in status.get("conditions") or []:
                if condition["type"] == "Ready" and condition["status"] == "True":
                    ready[name] = seconds_of(condition["lastTransitionTime"])
        if wanted <= ready.keys() or time.monotonic() > deadline:
            return ready
        await asyncio.sleep(5.0)


def seconds_of(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


async def _image_change(
    api: KubeApi, timeline: Timeline, config: ClusterBenchConfig
) -> dict[str, Any]:
    """Each Running session's image changed to ``bump_image`` at ``rate`` a second:
    until its AgentMigration is made; then until the moves end. A session whose move
    did not succeed is put back on the image it runs (so that the idle window after
    finds it idle); one that moved stays on ``bump_image``."""
    listed = (await list_all(api, namespaced("agentsessions", config.namespace)))[0]
    running = {
        b["metadata"]["name"] for b in listed if (b.get("status") or {}).get("phase") == "Running"
    }
    names_ = [f"s{i:04d}" for i in range(config.sessions) if f"s{i:04d}" in running]
    bumped: dict[str, float] = {}
    bumped_at: dict[str, float] = {}
    began = time.monotonic()
    for n, name in enumerate(names_):
        await asyncio.sleep(max(0.0, began + n / config.rate - time.monotonic()))
        await api.patch(
            namespaced("agentsessions", config.namespace, name),
            {"spec": {"image": config.bump_image}},
        )
        bumped[name] = time.monotonic()
        bumped_at[name] = time.time()
    migrations = {names.image_migration(n, 2): n for n in names_}
    # Read from a list as well as watched: until every move has ended, or the timeout.
    deadline = time.monotonic() + config.timeout_s
    finished: dict[str, dict[str, Any]] = {}
    while True:
        for body in (await list_all(api, namespaced("agentmigrations", config.namespace)))[0]:
            timeline.on_migration("LISTED", body, time.monotonic())
            if body["metadata"]["name"] in migrations:
                finished[body["metadata"]["name"]] = body
        if migrations.keys() <= timeline.migration_ended.keys() or time.monotonic() > deadline:
            break
        await asyncio.sleep(2.0)
    for migration, name in migrations.items():
        if timeline.migration_ended.get(migration) != "Succeeded":
            await api.patch(
                namespaced("agentsessions", config.namespace, name),
                {"spec": {"image": config.image}},
            )
    ended: dict[str, int] = {}
    for m in migrations:
        outcome = timeline.migration_ended.get(m, "unfinished")
        ended[outcome] = ended.get(outcome, 0) + 1
    return {
        "bump_image": config.bump_image,
        "sessions_bumped": len(names_),
        "migrations_ended": ended,
        "image_change_to_migration_s": percentiles(
            [
                timeline.migration[m] - bumped[n]
                for m, n in migrations.items()
                if m in timeline.migration
            ]
        ),
        # The same from the AgentMigration's creationTimestamp (whole seconds, so up to
        # 1 s early) against this machine's clock at the change: a check on the watch.
        "image_change_to_migration_by_creation_timestamp_s": percentiles(
            [
                seconds_of(finished[m]["metadata"]["creationTimestamp"]) - bumped_at[n]
                for m, n in migrations.items()
                if m in finished
            ]
        ),
        **migration_times(
            {m: finished[m] for m in migrations if m in finished},
            {m: bumped_at[n] for m, n in migrations.items()},
        ),
    }


def migration_times(
    migrations: dict[str, dict[str, Any]], changed_at: dict[str, float]
) -> dict[str, dict[str, float | int | None]]:
    """How long the moves that succeeded took, from their AgentMigrations' status (the
    operator's clock, to the microsecond): the engine's start to its end, the change
    sent to the end (the wait for admission under the operator's caps included), and
    the Fencing phase (while it lasts, a client's message waits for the new owner)."""
    moved = [
        (name, body["status"])
        for name, body in migrations.items()
        if (body.get("status") or {}).get("result") == "Succeeded"
        and body["status"].get("startTime")
        and body["status"].get("completionTime")
    ]
    return {
        "migration_s": percentiles(
            [seconds_of(s["completionTime"]) - seconds_of(s["startTime"]) for _, s in moved]
        ),
        "image_change_to_succeeded_s": percentiles(
            [
                seconds_of(s["completionTime"]) - changed_at[name]
                for name, s in moved
                if name in changed_at
            ]
        ),
        "fencing_ms": percentiles(
            [
                float(phase["durationMilliseconds"])
                for _, s in moved
                for phase in s.get("phases") or []
                if phase.get("phase") == "Fencing" and phase.get("durationMilliseconds") is not None
            ]
        ),
    }


async def remove_namespace(api: KubeApi, namespace: str) -> None:
    """The operator is stopped: its finalizers come off what it left, then the
    namespace goes (the garbage collector takes the pods)."""
    with contextlib.suppress(Exception):
        for plural in ("agentsessions", "agentmigrations"):
            for item in (await list_all(api, namespaced(plural, namespace)))[0]:
                if item["metadata"].get("finalizers"):
                    await api.patch(
                        namespaced(plural, namespace, item["metadata"]["name"]),
                        {"metadata": {"finalizers": None}},
                    )
        await api.delete(f"/api/v1/namespaces/{namespace}")
