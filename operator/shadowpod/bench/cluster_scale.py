"""``shadowpod bench cluster-scale``: the operator's cost at rest as sessions grow, on a
real control plane.

The operator runs as its own process against a real kube-apiserver and etcd (by
default `make cluster`'s), with the real scheduler and controllers; the sessions' pods
are placed by the scheduler on a hollow node (``bench.hollow``), which says them
Running and Ready without running anything — the real nodes are tainted ``NoSchedule``
for the run, so nothing lands there. To the operator such a session is a steady one:
its owner pod is Ready at its spec's image, nothing to do until something changes.

The sessions are made in steps (``steps``: 100, 1,000, 10,000 …, each step adding
sessions at ``rate`` a second until every one is Running); at each step, after
``settle_s``, a window of ``window_s`` measures what the operator costs while nothing
changes:

- its own requests a second to the API server and to the gateway (its
  ``shadowpod_operator_requests_total{to}``; Kopf's watches are not in it);
- the API server's requests a second from every client, by resource, and the
  ``shadowpod.dev`` group's (``apiserver_request_total``, from the server's /metrics);
- the operator's RSS (and its peak), the gateway's; and how many sessions still keep a
  periodic pass (``sessions.needs_passes`` on each as the watch last showed it).

After the steps in ``bump_at`` (and after the last step reached), ``bumped`` of the
running sessions have their image changed at ``bump_rate`` a second: the time from
each change sent to its AgentMigration's ADDED event on a watch, p50/p99. The image is
one the hollow node does not have (``ImagePullBackOff``, as a real kubelet says it), so
each move fails at its shadow, and the sessions are put back on their image after.

The run stops taking steps after ``budget_s`` (the shared cluster is held for a few
minutes at a time); what it measured is written to ``out`` part by part.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shadowpod.bench.cluster import (
    DEFAULT_KUBECONFIG,
    Cluster,
    OperatorProcess,
    RequestCounts,
    cluster_pid,
    create_paced,
    ensure_crds,
    percentiles,
    remove_namespace,
    require_kubeconfig,
    rss_mb,
    save_report,
    scrape_operator,
    seconds_of,
    taint_nodes,
)
from shadowpod.bench.hollow import HollowNode
from shadowpod.bench.informer import follow
from shadowpod.bench.machine import MachineProbe
from shadowpod.kube import names, sessions
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.handlers import api_client
from shadowpod.kube.models.v1alpha1 import API_VERSION, GROUP
from shadowpod.local.gateway_process import GatewayProcess

QUIET_PROBE_S: Final = 15.0


@dataclass(frozen=True)
class ScaleBenchConfig:
    kubeconfig: Path = DEFAULT_KUBECONFIG
    steps: tuple[int, ...] = (100, 1000, 10_000)
    rate: float = 40.0
    bumped: int = 100
    bump_rate: float = 10.0
    bump_at: frozenset[int] = frozenset({1000})
    window_s: float = 60.0
    settle_s: float = 15.0
    quiet_max_s: float = 240.0
    step_timeout_s: float = 900.0
    budget_s: float = 1200.0
    reconcile_interval_s: float = 30.0
    image: str = "shadowpod-refagent:v1"
    bump_image: str = "shadowpod-refagent:no-such-tag"
    workdir: Path = Path("/tmp/shadowpod-bench-cluster-scale")
    out: Path | None = None
    # The emulator has no scheduler: there the hollow node binds its pods itself.
    hollow_schedules: bool = False
    # Leave what was made (the cluster is taken down after): deleting 10,000 sessions
    # one by one takes longer than the run.
    cleanup: bool = True
    namespace: str = field(default_factory=lambda: f"scale-{uuid.uuid4().hex[:6]}")


def _session(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": name},
        # A bumped session's move fails (no node has the image; nothing answers for
        # the source): each phase given 5 s, not 30, so the failed moves end soon.
        "spec": {
            "image": image,
            "migration": {"drainGracePeriodSeconds": 2, "phaseTimeoutSeconds": 5},
        },
    }


def session_name(i: int) -> str:
    return f"s{i:05d}"


class Sessions:
    """The sessions and migrations as the benchmark's watches last showed them."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}
        self.running: dict[str, float] = {}
        self.migration_added: dict[str, float] = {}
        self.migration_result: dict[str, str] = {}

    def on_session(self, kind: str, body: dict[str, Any], at: float) -> None:
        name = body["metadata"]["name"]
        if kind == "DELETED":
            self.bodies.pop(name, None)
            return
        self.bodies[name] = body
        status = body.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if status.get("phase") == "Running" and ready:
            self.running.setdefault(name, at)

    def on_migration(self, kind: str, body: dict[str, Any], at: float) -> None:
        name = body["metadata"]["name"]
        if kind == "ADDED":  # a LISTED one was seen later than it was made
            self.migration_added.setdefault(name, at)
        if result := (body.get("status") or {}).get("result"):
            self.migration_result[name] = result

    def needing_passes(self) -> int:
        return sum(1 for body in list(self.bodies.values()) if sessions.needs_passes(body))

    def phases(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for body in list(self.bodies.values()):
            phase = (body.get("status") or {}).get("phase") or "none"
            counts[phase] = counts.get(phase, 0) + 1
        return counts


async def _until(what: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
    return True


async def _create(
    api: KubeApi, config: ScaleBenchConfig, numbers: range, created: dict[str, float]
) -> None:
    """Sessions ``numbers`` made at ``rate`` a second."""
    bodies = [_session(session_name(i), config.image) for i in numbers]
    path = namespaced("agentsessions", config.namespace)
    await create_paced(api, path, bodies, config.rate, created)


async def _quiet(operator: OperatorProcess, config: ScaleBenchConfig) -> dict[str, Any]:
    """Until the operator has caught up with what the step's creations told it (its
    API requests under one in ``QUIET_PROBE_S``), at most ``quiet_max_s``: on a loaded
    machine its handlers run minutes behind the watch events. How long it took, and
    whether it went quiet at all (if not, the window measures work still owed — or a
    cost that does not stop)."""
    began = time.monotonic()
    while True:
        before = (await scrape_operator(operator.metrics_port)).get("api", 0)
        await asyncio.sleep(QUIET_PROBE_S)
        after = (await scrape_operator(operator.metrics_port)).get("api", 0)
        quiet = after - before < 1
        waited = time.monotonic() - began
        if quiet or waited >= config.quiet_max_s:
            return {"went_quiet": quiet, "waited_s": round(waited, 1)}


async def _idle(
    cluster: Cluster,
    operator: OperatorProcess,
    gateway: GatewayProcess,
    state: Sessions,
    config: ScaleBenchConfig,
) -> dict[str, Any]:
    """One window with nothing changed by anyone: what the operator asks for."""
    needing_before = state.needing_passes()
    before = await RequestCounts.now(cluster, operator.metrics_port)
    await asyncio.sleep(config.window_s)
    after = await RequestCounts.now(cluster, operator.metrics_port)
    by_resource = after.apiserver_rates(before)
    pid = None if operator.process is None else operator.process.pid
    return {
        "window_s": round(after.seconds_since(before), 1),
        "operator_api_requests_per_s": after.operator_rate(before, "api"),
        "operator_gateway_requests_per_s": after.operator_rate(before, "gateway"),
        "apiserver_requests_per_s_all_clients": round(sum(by_resource.values()), 3),
        "apiserver_shadowpod_group_requests_per_s": round(
            sum(v for k, v in by_resource.items() if k.startswith(f"{GROUP}/")), 4
        ),
        "apiserver_by_resource": dict(list(by_resource.items())[:20]),
        "sessions_keeping_periodic_passes": {
            "before": needing_before,
            "after": state.needing_passes(),
        },
        "rss_mb": {
            "operator": rss_mb(pid),
            "gateway": rss_mb(None if gateway.process is None else gateway.process.pid),
            "kube-apiserver": rss_mb(cluster_pid("kube-apiserver")),
            "etcd": rss_mb(cluster_pid("etcd")),
        },
        "load_average": os.getloadavg(),
    }


async def _bump(
    api: KubeApi,
    cluster: Cluster,
    operator: OperatorProcess,
    state: Sessions,
    config: ScaleBenchConfig,
    done: set[str],
    progress: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """``bumped`` running sessions not bumped before: image changed → AgentMigration;
    and who asked the API server for what meanwhile (the moves that follow are what
    load it)."""
    before = await RequestCounts.now(cluster, operator.metrics_port)
    chosen = [n for n in sorted(state.running) if n not in done][: config.bumped]
    done.update(chosen)
    sent: dict[str, float] = {}
    sent_wall: dict[str, float] = {}
    wanted: dict[str, str] = {}
    began = time.monotonic()
    for n, name in enumerate(chosen):
        await asyncio.sleep(max(0.0, began + n / config.bump_rate - time.monotonic()))
        sent[name], sent_wall[name] = time.monotonic(), time.time()
        patched = await api.patch(
            namespaced("agentsessions", config.namespace, name),
            {"spec": {"image": config.bump_image}},
        )
        generation = int(((patched or {}).get("metadata") or {}).get("generation") or 0)
        wanted[names.image_migration(name, generation)] = name
    made = await _until(lambda: wanted.keys() <= state.migration_added.keys(), 120.0)
    partial = {
        "sessions": len(state.bodies),
        "bumped": len(chosen),
        "every_migration_made": made,
        "image_change_to_migration_s": percentiles(
            [
                state.migration_added[m] - sent[n]
                for m, n in wanted.items()
                if m in state.migration_added
            ]
        ),
    }
    progress(partial)  # kept if the run is stopped while the moves end
    ended = await _until(lambda: wanted.keys() <= state.migration_result.keys(), 180.0)
    outcomes: dict[str, int] = {}
    for migration in wanted:
        outcome = state.migration_result.get(migration, "unfinished")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    created_at = {
        m: seconds_of(state_body["metadata"]["creationTimestamp"])
        for m, state_body in (await _migrations(api, config, set(wanted))).items()
    }
    after = await RequestCounts.now(cluster, operator.metrics_port)
    for name in chosen:  # back to the image they run: steady again, no move
        await api.patch(
            namespaced("agentsessions", config.namespace, name), {"spec": {"image": config.image}}
        )
    return {
        "seconds": round(after.seconds_since(before), 1),
        "operator_requests_per_s": {
            to: after.operator_rate(before, to) for to in ("api", "gateway")
        },
        "apiserver_by_resource": dict(list(after.apiserver_rates(before).items())[:15]),
        "sessions": len(state.bodies),
        "bumped": len(chosen),
        "rate_per_s": config.bump_rate,
        "every_migration_made": made,
        "every_migration_ended": ended,
        "migrations_ended": outcomes,
        "image_change_to_migration_s": percentiles(
            [
                state.migration_added[m] - sent[n]
                for m, n in wanted.items()
                if m in state.migration_added
            ]
        ),
        # The AgentMigration's creationTimestamp (whole seconds: up to 1 s early)
        # against this machine's clock when the change was sent: a check on the watch.
        "image_change_to_migration_by_creation_timestamp_s": percentiles(
            [created_at[m] - sent_wall[n] for m, n in wanted.items() if m in created_at]
        ),
        "load_average": os.getloadavg(),
    }


async def _migrations(
    api: KubeApi, config: ScaleBenchConfig, wanted: set[str]
) -> dict[str, dict[str, Any]]:
    found = {}
    for name in wanted:
        body = await api.get(namespaced("agentmigrations", config.namespace, name))
        if body is not None:
            found[name] = body
    return found


async def run_scale_bench(config: ScaleBenchConfig) -> dict[str, Any]:
    require_kubeconfig(config.kubeconfig)
    probe = MachineProbe()
    probe.start()
    config.workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {
        "complete": False,
        "config": {k: str(v) for k, v in vars(config).items()},
        "pods": "on a hollow node (bench.hollow): scheduled by the real scheduler, said "
        "Running and Ready, nothing run; the real nodes tainted NoSchedule",
        "load_average_before": os.getloadavg(),
        "steps": [],
        "bumps": [],
    }
    gateway = GatewayProcess(config.workdir / "gateway", host="127.0.0.1")
    await gateway.start()
    state = Sessions()
    created: dict[str, float] = {}
    watches: list[asyncio.Task[None]] = []
    async with await api_client(str(config.kubeconfig)) as client:
        api = KubeApi(client)
        cluster = Cluster(api, config.namespace)
        operator = OperatorProcess(
            config.kubeconfig,
            config.namespace,
            config.workdir,
            gateway,
            reconcile_interval_s=config.reconcile_interval_s,
        )
        result["crds_installed"] = await ensure_crds(api)
        await api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": config.namespace}},
        )
        result["tainted_nodes"] = await taint_nodes(api, on=True)
        hollow = HollowNode(
            api,
            f"hollow-{config.namespace}",
            frozenset({config.image}),
            schedules=config.hollow_schedules,
        )
        try:
            async with hollow:
                for plural, handler in (
                    ("agentsessions", state.on_session),
                    ("agentmigrations", state.on_migration),
                ):
                    watches.append(
                        asyncio.create_task(
                            follow(
                                api,
                                namespaced(plural, config.namespace),
                                handler,
                                breaks=cluster.watch_breaks,
                            )
                        )
                    )
                await operator.start()
                await asyncio.sleep(3.0)
                await _steps(
                    api, cluster, operator, gateway, state, created, config, result, started
                )
                result["hollow_node"] = {"failures": hollow.failures, "watch_breaks": hollow.breaks}
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await operator.stop()
            with contextlib.suppress(Exception):
                await taint_nodes(api, on=False)
            if config.cleanup:
                await remove_namespace(api, config.namespace)
            await gateway.stop()
    result["watch_breaks"] = cluster.watch_breaks
    result["load_average_after"] = os.getloadavg()
    result["machine"] = probe.report()
    result["complete"] = True
    save_report(config.out, result)
    return result


async def _steps(
    api: KubeApi,
    cluster: Cluster,
    operator: OperatorProcess,
    gateway: GatewayProcess,
    state: Sessions,
    created: dict[str, float],
    config: ScaleBenchConfig,
    result: dict[str, Any],
    started: float,
) -> None:
    made = 0
    bumped: set[str] = set()
    for number, step in enumerate(config.steps):
        left = config.budget_s - (time.monotonic() - started)
        if left <= 0 or step <= made:
            result["stopped_before_step"] = step
            break
        began, before = time.monotonic(), made
        await _create(api, config, range(made, step), created)
        made = step
        wanted = {session_name(i) for i in range(made)}
        every = await _until(
            lambda: wanted <= state.running.keys(),  # noqa: B023 — awaited in this pass
            min(config.step_timeout_s, config.budget_s - (time.monotonic() - started)),
        )
        new = [session_name(i) for i in range(before, made)]
        figures: dict[str, Any] = {
            "sessions": made,
            "running": len(wanted & state.running.keys()),
            "every_session_running": every,
            "seconds_to_all_running": round(time.monotonic() - began, 1) if every else None,
            "create_to_running_s": percentiles(
                [state.running[n] - created[n] for n in new if n in state.running and n in created]
            ),
            "phases": state.phases(),
        }
        await asyncio.sleep(config.settle_s)
        figures["settle"] = await _quiet(operator, config)
        figures["idle"] = await _idle(cluster, operator, gateway, state, config)
        result["steps"].append(figures)
        result["watch_breaks"] = cluster.watch_breaks
        save_report(config.out, result)
        last = number == len(config.steps) - 1 or (
            config.budget_s - (time.monotonic() - started) < config.window_s * 2
        )
        if step in config.bump_at or last:
            bumps: list[dict[str, Any]] = result["bumps"]
            at = len(bumps)

            def progress(
                partial: dict[str, Any], at: int = at, bumps: list[dict[str, Any]] = bumps
            ) -> None:
                bumps[at:] = [{**partial, "partial": True}]
                save_report(config.out, result)

            bumps[at:] = [await _bump(api, cluster, operator, state, config, bumped, progress)]
            save_report(config.out, result)
        if not every:
            result["stopped_after_step"] = step
            break
