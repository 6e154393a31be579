"""The cluster-wide pacing queue, over the API: which AgentMigrations run now.

Every AgentMigration — a rollout's, a node drain's, an image change's, a user's — starts
``Queued`` (its daemon writes the phase) and runs once this loop admits it by writing
``Pending``: the decision is ``fleet.pacing.admit`` over every unfinished migration of
what the operator serves, under ``--max-concurrent-migrations`` and
``--max-concurrent-migrations-per-node``. Nothing lives only here: whether a migration
was admitted is its phase in the API, so a restarted operator counts the running ones
and goes on admitting from where the phases say.

One loop for all of them, woken when a migration asks or ends, and every
``reconcile_interval_s`` while any migration is unfinished; with none, it waits for the
next ask (a new migration's daemon, a restarted operator's resumed ones) and costs the
API server nothing while the fleet is idle. A daemon waiting its turn is woken by the
loop when it admits it (and looks at its phase now and then in any case).

Only the oldest unfinished migration of a session is a candidate: a session's
migrations run one at a time, and a later one must not hold a slot while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from datetime import datetime
from typing import Any, Final

from shadowpod.domain.errors import ShadowpodError
from shadowpod.fleet.pacing import Request, admit, drain_group, rollout_group, session_group
from shadowpod.kube.api import namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import GROUP, VERSION
from shadowpod.kube.models.v1alpha1.deployment import DEPLOYMENT_LABEL

logger = logging.getLogger("shadowpod.operator")

QUEUED: Final = "Queued"
FINISHED: Final = frozenset({"Succeeded", "RolledBack", "Failed"})
# A waiting daemon reads its phase this often even unwoken (another operator process's
# loop, a missed wake): the phase in the API is the truth.
RECHECK_S: Final = 10.0


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class AdmissionQueue:
    def __init__(self, ctx: OperatorContext) -> None:
        self.ctx = ctx
        self.caps = ctx.config.caps()
        self._wake = asyncio.Event()
        self._admitted: dict[str, asyncio.Event] = {}
        # Unfinished migrations at the last pass (None: no pass yet, or it failed).
        self.unfinished: int | None = None

    def poke(self) -> None:
        """Something changed (a migration asks, one ended): look again now."""
        self._wake.set()

    async def run(self) -> None:
        """The loop, until cancelled; a pass that fails is logged and tried again."""
        while True:
            self._wake.clear()
            try:
                await self.admit_now()
            except (ShadowpodError, OSError, TimeoutError) as exc:
                self.unfinished = None
                logger.warning("the pacing queue could not admit migrations: %s", exc)
            if self.unfinished == 0:
                await self._wake.wait()  # nothing to pace until a migration asks
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), timeout=self.ctx.config.reconcile_interval_s
                    )
            # Several asks at once (a rollout creates a batch) are looked at together.
            await asyncio.sleep(0.05)

    async def wait_turn(self, body: dict[str, Any], stopped: Any) -> bool:
        """Wait until the migration ``body`` is admitted (its phase past ``Queued``);
        ``False`` when stopped or when it is gone meanwhile."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        path = namespaced("agentmigrations", namespace, name)
        key = _key(namespace, name)
        event = self._admitted.setdefault(key, asyncio.Event())
        try:
            while not stopped:
                fresh = await self.ctx.api.get(path)
                if fresh is None or fresh["metadata"].get("deletionTimestamp"):
                    return False
                status = fresh.get("status") or {}
                phase = status.get("phase")
                if phase is None:
                    await self._queue(fresh)
                elif phase != QUEUED:
                    return True
                self.poke()
                event.clear()
                waiter = asyncio.ensure_future(event.wait())
                halt = asyncio.ensure_future(stopped.wait())
                try:
                    await asyncio.wait(
                        {waiter, halt}, timeout=RECHECK_S, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    waiter.cancel()
                    halt.cancel()
            return False
        finally:
            self._admitted.pop(key, None)

    async def _queue(self, migration: dict[str, Any]) -> None:
        meta = migration["metadata"]
        message = (
            "waiting in the cluster-wide pacing queue: at most"
            f" {self.caps.max_concurrent} migrations run at once"
            f" ({self.caps.max_per_node} out of one node)"
        )
        await self.ctx.api.patch(
            f"{namespaced('agentmigrations', meta['namespace'], meta['name'])}/status",
            {
                "status": {
                    "observedGeneration": meta.get("generation"),
                    "phase": QUEUED,
                    "message": message,
                }
            },
        )

    async def admit_now(self) -> tuple[str, ...]:
        """One pass: admit what fits, say how many wait. Returns the admitted ones."""
        migrations = await self._everywhere("agentmigrations")
        sessions = await self._everywhere("agentsessions")
        nodes = {
            (s["metadata"]["namespace"], s["metadata"]["name"]): (s.get("status") or {}).get(
                "nodeName"
            )
            for s in sessions
        }
        by_session: defaultdict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for migration in migrations:
            status = migration.get("status") or {}
            if status.get("phase") in FINISHED or migration["metadata"].get("deletionTimestamp"):
                continue
            session = (migration.get("spec") or {}).get("sessionRef", {}).get("name", "")
            by_session[(migration["metadata"]["namespace"], session)].append(migration)
        requests: list[Request] = []
        for (namespace, session), pending in by_session.items():
            pending.sort(key=lambda m: (_created(m), m["metadata"]["name"]))
            node = nodes.get((namespace, session))
            for index, migration in enumerate(pending):
                running = (migration.get("status") or {}).get("phase") not in (None, QUEUED)
                if not running and index > 0:
                    continue  # behind the session's own older migration
                requests.append(
                    Request(
                        name=_key(namespace, migration["metadata"]["name"]),
                        group=_group(migration, namespace, session, node),
                        node=node,
                        queued_at=_created(migration),
                        running=running,
                    )
                )
        decision = admit(requests, self.caps)
        for key in decision.admit:
            namespace, _, name = key.partition("/")
            patched = await self.ctx.api.patch(
                f"{namespaced('agentmigrations', namespace, name)}/status",
                {"status": {"phase": "Pending", "message": "admitted by the pacing queue"}},
            )
            if patched is not None and (event := self._admitted.get(key)) is not None:
                event.set()
        self.unfinished = sum(len(pending) for pending in by_session.values())
        in_flight = sum(1 for r in requests if r.running) + len(decision.admit)
        self.ctx.metrics.migrations_queued.set(len(decision.queue))
        self.ctx.metrics.migrations_admitted.set(in_flight)
        return decision.admit

    async def _everywhere(self, plural: str) -> list[dict[str, Any]]:
        namespaces = self.ctx.config.namespaces
        if not namespaces:
            return list(await self.ctx.api.list(f"/apis/{GROUP}/{VERSION}/{plural}"))
        found: list[dict[str, Any]] = []
        for namespace in namespaces:
            found.extend(await self.ctx.api.list(namespaced(plural, namespace)))
        return found


def _created(migration: dict[str, Any]) -> float:
    stamp = migration["metadata"].get("creationTimestamp")
    if not stamp:
        return 0.0
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def _group(migration: dict[str, Any], namespace: str, session: str, node: str | None) -> str:
    """Each rollout one group, each drained node one, each session's own moves one."""
    labels = migration["metadata"].get("labels") or {}
    if deployment := labels.get(DEPLOYMENT_LABEL):
        return rollout_group(namespace, deployment)
    if (migration.get("spec") or {}).get("reason") == "NodeDrain" and node:
        return drain_group(node)
    return session_group(namespace, session)
