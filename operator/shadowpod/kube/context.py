"""What every reconcile shares: the API, the gateway, settings, metrics; and events.

Events are posted straight to the API (not through Kopf's queue) so that the
migration daemons can post them on the session as well as on the migration. They
are best effort, as every controller's are: an event that cannot be posted is
logged, never a reason for a reconcile to fail.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp
from pydantic import ValidationError

from shadowpod.client.control import GatewayControl
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.ports import ImageInfo
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.backoff import FailureBackoff
from shadowpod.kube.config import OperatorConfig
from shadowpod.kube.metrics import OperatorMetrics
from shadowpod.kube.models.v1alpha1 import SessionPhase
from shadowpod.kube.watchedpods import WatchedPods

logger = logging.getLogger("shadowpod.operator")

EventType = Literal["Normal", "Warning"]
COMPONENT = "shadowpod-operator"
# Which operator process reported an event: its pod's name in a cluster.
REPORTING_INSTANCE = socket.gethostname()[:128] or COMPONENT


def backoff_key(kind: str, body: Mapping[str, Any]) -> tuple[str, str, str]:
    """The object a failure is counted against, for ``OperatorContext.backoff``."""
    return (kind, body["metadata"]["namespace"], body["metadata"]["name"])


@dataclass(frozen=True)
class Failure:
    """A failed reconcile, as said on the object: why, and when it is tried again."""

    reason: str
    retry_s: float


@dataclass
class OperatorContext:
    api: KubeApi
    admin: GatewayClient
    http: aiohttp.ClientSession
    config: OperatorConfig
    metrics: OperatorMetrics
    # Sessions by phase, for the sessions gauge: (namespace, name) -> phase.
    session_phases: dict[tuple[str, str], str] = field(default_factory=dict)
    unready_owners: set[tuple[str, str]] = field(default_factory=set)
    # Rollouts by phase, for the rollouts gauge: (namespace, name) -> phase.
    rollout_phases: dict[tuple[str, str], str] = field(default_factory=dict)
    # Rollouts with a pass waiting for the one running to end: another ask is folded
    # into it (it reads the world after that one), not queued behind it.
    rollout_passes_due: set[tuple[str, str]] = field(default_factory=set)
    # The problem last said (as a Warning event) of each session, "namespace/name".
    problems_said: dict[str, str] = field(default_factory=dict)
    # What each image reported when its pods ran, shared by every session's runtime
    # (and gone with this operator).
    known_images: dict[str, ImageInfo] = field(default_factory=dict)
    # Each AgentSession's status as the watch last delivered it, (namespace, name) ->
    # status: the operator's periodic look compares it with the gateway (``positions``).
    watched_sessions: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # The sessions' pods as the pod watch last showed them (a pass reads its owner here).
    watched_pods: WatchedPods = field(default_factory=WatchedPods)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # When each object whose reconcile failed may be tried again.
    backoff: FailureBackoff = field(init=False)

    def __post_init__(self) -> None:
        self.backoff = FailureBackoff(first_s=self.config.reconcile_interval_s)

    def lock(self, key: str) -> asyncio.Lock:
        """One holder at a time for ``key`` (a session, a migration) in this operator."""
        return self._locks.setdefault(key, asyncio.Lock())

    @property
    def control(self) -> GatewayControl:
        return GatewayControl(self.admin)

    def count_session(self, key: tuple[str, str], phase: str | None, *, ready: bool) -> None:
        if phase is None:
            self.session_phases.pop(key, None)
            self.unready_owners.discard(key)
        else:
            self.session_phases[key] = phase
            # A suspended session has no owner on purpose: no alert for it.
            served = ready or phase == SessionPhase.SUSPENDED
            (self.unready_owners.discard if served else self.unready_owners.add)(key)
        for known in SessionPhase:
            count = sum(1 for p in self.session_phases.values() if p == known)
            self.metrics.sessions.labels(phase=known).set(count)
        self.metrics.sessions_without_owner.set(len(self.unready_owners))

    async def reconcile_failed(
        self, body: Mapping[str, Any], kind: str, exc: ShadowpodError | ValidationError
    ) -> Failure:
        """A reconcile of ``body`` that failed, said (logged, counted, a Warning event)
        and backed off: the object is tried again after a wait that doubles with each
        failure (``backoff``), or at once when its spec changes."""
        # A spec the API server admitted but the operator's models refuse: a CRD older
        # than the operator, say.
        reason = "InvalidSpec" if isinstance(exc, ValidationError) else exc.reason
        meta = body["metadata"]
        delay = self.backoff.failed(backoff_key(kind, body), meta.get("generation"))
        logger.warning("%s %s/%s: %s: %s", kind, meta["namespace"], meta["name"], reason, exc)
        self.metrics.reconcile_errors.labels(kind=kind, reason=reason).inc()
        await self.event(body, "Warning", reason, f"{exc}; trying again in {delay:g} s")
        return Failure(reason, delay)

    async def event(
        self, obj: Mapping[str, Any], kind: EventType, reason: str, message: str
    ) -> None:
        meta = obj["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            # A real API server requires both of an event with an eventTime (422 without).
            "reportingInstance": REPORTING_INSTANCE,
            "action": reason[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
            "count": 1,
        }
        try:
            await self.api.create(namespaced("events", meta["namespace"]), body)
        except ShadowpodError as exc:
            logger.warning("could not post event %s on %s: %s", reason, meta["name"], exc)

    async def event_on(
        self, plural: str, namespace: str, name: str, kind: EventType, reason: str, message: str
    ) -> None:
        """An event on the object ``plural``/``name``, read first (best effort too)."""
        try:
            obj = await self.api.get(namespaced(plural, namespace, name))
        except ShadowpodError as exc:
            logger.warning("could not post event %s on %s: %s", reason, name, exc)
            return
        if obj is not None:
            await self.event(obj, kind, reason, message)
