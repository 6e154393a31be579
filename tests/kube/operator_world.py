"""The operator's test world: an API server (the emulator with the kubelet stand-in
running pods as processes, or a real cluster whose kubelets run them in containers),
a real gateway, and the operator in a Kopf thread — with helpers to read what a user
would read (``kubectl get ags/agm``, pods, events), to drive client load, to bump a
session's image and to check the client-side invariants.

The image tests (tests/image) use the same world with the gateway, the operator and
the agents in containers of the real image."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from click.testing import CliRunner, Result
from kubernetes_asyncio import client

from shadowpod.cli.kubectl import kubectl
from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.engine.record import MigrationRecord
from shadowpod.kube import names
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.config import OperatorConfig
from shadowpod.kube.handlers import OperatorMemo, registry
from shadowpod.kube.metrics import OperatorMetrics
from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.kube.records import RECORD_ANNOTATION
from shadowpod.local.checks import session_checks
from shadowpod.local.gateway_process import GatewayProcess
from shadowpod.local.load import ClientLoad
from shadowpod.local.outcome import MigrationOutcome
from tests.kube.connection import KubeConnection
from tests.kube.kopf_thread import OperatorThread
from tests.kube.support import eventually

NAME = "Ada"


def session_manifest(name: str, image: str = "refagent:v1", **spec: Any) -> dict[str, Any]:
    policy = spec.pop("migration", {})
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "migration": {"fenceTimeoutSeconds": 5, "drainGracePeriodSeconds": 2, **policy},
            **spec,
        },
    }


class Gateway(Protocol):
    """A running gateway: a process here, or a container of the image."""

    @property
    def url(self) -> str: ...

    @property
    def control_token(self) -> str: ...


class Nodes(Protocol):
    """The nodes pods run on: the stand-in adds one; a real cluster has it already."""

    async def add_node(self, name: str) -> None: ...


class World:
    def __init__(
        self,
        api: client.ApiClient,
        kube: KubeConnection,
        gateway: Gateway,
        namespace: str,
        nodes: Nodes | None = None,
    ) -> None:
        self.raw = KubeApi(api)
        self.kube = kube
        self.gateway = gateway
        self.namespace = namespace
        self._nodes = nodes
        self.metrics = OperatorMetrics()
        self.operator: OperatorThread | None = None
        self.memo: OperatorMemo | None = None  # the running operator's
        # The CRIU path: the operator's --criu and --checkpoint-registry.
        self.criu = False
        self.checkpoint_registry: str | None = None
        self.checkpoint_registry_insecure = False
        # The pacing queue's caps: the operator's --max-concurrent-migrations[-per-node].
        self.max_concurrent_migrations = 10
        self.max_concurrent_migrations_per_node = 2

    @property
    def nodes(self) -> Nodes:
        assert self._nodes is not None, "this world was made without its nodes"
        return self._nodes

    def config(self) -> OperatorConfig:
        return OperatorConfig(
            gateway_url=self.gateway.url,
            agent_gateway_url=self.gateway.url,
            control_token=self.gateway.control_token,
            namespaces=(self.namespace,),
            kubeconfig=self.kube.kubeconfig,
            reconcile_interval_s=0.5,
            deletion_attempts=3,
            criu=self.criu,
            checkpoint_registry=self.checkpoint_registry,
            checkpoint_registry_insecure=self.checkpoint_registry_insecure,
            max_concurrent_migrations=self.max_concurrent_migrations,
            max_concurrent_migrations_per_node=self.max_concurrent_migrations_per_node,
        )

    async def start_operator(self) -> None:
        config = self.config()
        self.memo = OperatorMemo(config, self.metrics)
        self.operator = OperatorThread(
            registry(config), self.kube, namespaces=[self.namespace], memo=self.memo
        )
        await self.operator.start()

    async def stop_operator(self) -> None:
        if self.operator is not None:
            await self.operator.stop()
            self.operator = None

    # --- what a user reads ------------------------------------------------------------

    def path(self, plural: str, name: str | None = None) -> str:
        return namespaced(plural, self.namespace, name)

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        plural = manifest["kind"].lower() + "s"
        return await self.raw.create(self.path(plural), manifest)

    async def session(self, name: str) -> dict[str, Any]:
        found = await self.raw.get(self.path("agentsessions", name))
        assert found is not None, f"AgentSession {name} is gone"
        return found

    async def migration(self, name: str) -> dict[str, Any] | None:
        return await self.raw.get(self.path("agentmigrations", name))

    async def pods(self, session: str) -> list[dict[str, Any]]:
        return await self.raw.list(self.path("pods"), labels=names.session_selector(session))

    async def events(self, name: str) -> list[tuple[str, str, str]]:
        listed = await self.raw.list(self.path("events"))
        return [
            (e["type"], e["reason"], e["message"])
            for e in listed
            if e["involvedObject"]["name"] == name
        ]

    async def wait_running(
        self, name: str, *, epoch: int | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        async def running() -> dict[str, Any] | None:
            body = await self.session(name)
            status = body.get("status") or {}
            ready = any(
                c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
            )
            if (
                status.get("phase") == "Running"
                and ready
                and (epoch is None or status.get("epoch") == epoch)
            ):
                return body
            return None

        result: dict[str, Any] = await eventually(running, timeout=timeout, every=0.2)
        return result

    async def wait_settled(self, name: str, *, epoch: int, timeout: float = 60) -> dict[str, Any]:
        """The session Running at ``epoch`` with its last migration's summary written
        (the migration's end and the session's next status pass come in either order)."""

        async def settled() -> dict[str, Any] | None:
            body = await self.wait_running(name, epoch=epoch, timeout=timeout)
            last = (body.get("status") or {}).get("lastMigration") or {}
            return body if last.get("result") else None

        result: dict[str, Any] = await eventually(settled, timeout=timeout, every=0.2)
        return result

    async def wait_finished(self, name: str, timeout: float = 120) -> dict[str, Any]:
        async def finished() -> dict[str, Any] | None:
            body = await self.migration(name)
            if body is not None and (body.get("status") or {}).get("result"):
                return body
            return None

        result: dict[str, Any] = await eventually(finished, timeout=timeout, every=0.2)
        return result

    @staticmethod
    def record(migration: dict[str, Any]) -> MigrationRecord:
        return MigrationRecord.model_validate_json(
            migration["metadata"]["annotations"][RECORD_ANNOTATION]
        )

    def gateway_session(self, name: str) -> str:
        return names.gateway_session(self.namespace, name)

    def client(self) -> GatewayClient:
        return GatewayClient(self.gateway.url)


async def plugin(world: World, *args: str) -> Result:
    """``kubectl shadowpod ARGS``, as kubectl runs it (its own process' event loop)."""
    runner = CliRunner()
    base = ["--kubeconfig", str(world.kube.kubeconfig), "-n", world.namespace]
    wide = {"COLUMNS": "200"}  # a wide terminal: rich fits tables to its width
    return await asyncio.to_thread(
        runner.invoke, kubectl, [*base, *args], env=wide, catch_exceptions=False
    )


async def bump(world: World, session: str, image: str) -> str:
    """Change the session's image; the AgentMigration the operator creates for it."""
    body = await world.raw.patch(world.path("agentsessions", session), {"spec": {"image": image}})
    assert body is not None
    wanted = names.image_migration(session, body["metadata"]["generation"])
    await eventually(lambda: world.migration(wanted), timeout=30)
    return wanted


ALL_INVARIANTS = frozenset(
    {
        "lost",
        "duplicated",
        "reordered",
        "one version per reply",
        "migrations succeeded",
        "new versions answer with v1's memory",
    }
)


def invariants(
    load: Load, migrations: list[dict[str, Any]], wanted: frozenset[str] = ALL_INVARIANTS
) -> dict[str, str]:
    """The demo's client-side checks, from the migrations' records: what broke."""
    outcomes = [
        MigrationOutcome(record=World.record(m), started=0.0, ended=time.monotonic())
        for m in migrations
    ]
    checks = session_checks(outcomes, load.load, [], name=NAME)
    return {c.name: c.detail for c in checks if c.name in wanted and c.measured and not c.ok}


async def reply_counts(client: GatewayClient, session: str) -> dict[int, int]:
    """How many assistant replies each inbound turn (by seq) got so far, of the turns
    the journal still holds: the session's retention (``checkpoint.retainSnapshots``)
    removes the processed entries behind its oldest kept snapshot, and the count starts
    again behind what it removed when it removes more while this reads."""
    while True:
        after = (await client.status(session)).truncated_through
        try:
            return await _reply_counts_after(client, session, after)
        except GatewayError as exc:
            if exc.reason != "JournalTruncated":
                raise


async def _reply_counts_after(client: GatewayClient, session: str, after: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    while True:
        page = await client.events(session, after=after, kinds=["message"])
        for entry in page.events:
            payload = entry.get("payload")
            turn = payload.get("turn") if isinstance(payload, dict) else None
            if (
                isinstance(payload, dict)
                and payload.get("role") == "assistant"
                and isinstance(turn, int)
            ):
                counts[turn] = counts.get(turn, 0) + 1
        if page.next_after <= after or not page.events:
            return counts
        after = page.next_after


class Load:
    """Client load on one session, with its replies watched (the demo's own checks)."""

    def __init__(
        self,
        world: World,
        session: str,
        rate: float,
        *,
        message: Callable[[int], str] | None = None,
        prefix: str = "load",
    ) -> None:
        """``prefix`` names the messages' idempotency ids: a second load on the same
        session needs its own, or the gateway takes its messages for the first's."""
        self.client = world.client()
        self.session = world.gateway_session(session)
        self.load = ClientLoad(self.client, self.session, rate, message=message, prefix=prefix)
        self.seed_id = "seed-name" if prefix == "load" else f"{prefix}-seed-name"
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Load:
        await self.client.__aenter__()
        await self.client.post_message(self.session, f"my name is {NAME}", id=self.seed_id)
        self._tasks = [
            asyncio.create_task(self.load.watch()),
            asyncio.create_task(self.load.run(self._stop)),
        ]
        return self

    async def stop(self, *, answered_within: float = 60) -> bool:
        self._stop.set()
        await self._tasks[1]
        return await self.load.wait_answered(answered_within)

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()


async def world_of(
    kube: KubeConnection,
    namespace: str,
    workdir: Path,
    *,
    nodes: Nodes | None = None,
    gateway_host: str = "127.0.0.1",
) -> AsyncIterator[World]:
    """``gateway_host``: where the gateway listens — an address the pods reach (on a
    real cluster, one the nodes' pod networks route to this machine)."""
    gateway = GatewayProcess(workdir / "gateway", host=gateway_host)
    await gateway.start()
    try:
        async with kube.api() as api:
            world = World(api, kube, gateway, namespace, nodes)
            try:
                yield world
            finally:
                await world.stop_operator()
    finally:
        await gateway.stop()
