"""The operator's Prometheus metrics (``/metrics``).

Names carry the ``shadowpod_`` prefix; histograms are in seconds with explicit buckets
up to ten minutes (the client's default stops at ten seconds, and a migration's
``maxDurationSeconds`` may be far longer); counters end in ``_total``. No label holds a
session's or a migration's name: a cluster has thousands, and each would be a series.
The alerts in the Helm chart (``charts/shadowpod``) and their tests read these names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from shadowpod import __version__
from shadowpod.fleet.progress import RolloutPhase

# Up to 10 minutes: a migration's phases take milliseconds to minutes.
DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# A fence pause is what a user waits through: finer at the low end.
PAUSE_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    600.0,
)

# A migration's duration as a share of its policy's maxDurationSeconds: the slow-migration
# alert's threshold is one of these bounds.
POLICY_SHARE_BUCKETS: Final = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0, 5.0)
RESULTS: Final = ("Succeeded", "RolledBack", "Failed")

# The share of compared turns that agreed: finer where the gates' thresholds are.
AGREEMENT_BUCKETS: Final = (0.1, 0.25, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.migrations = Counter(
            "shadowpod_migrations",
            "Finished migrations, by result (Succeeded, RolledBack, Failed) and reason "
            "(the failure's reason; the request's reason when it succeeded).",
            ["result", "reason"],
            registry=r,
        )
        self.migration_duration = Histogram(
            "shadowpod_migration_duration_seconds",
            "Time from a migration's start to its end, by result.",
            ["result"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.migration_policy_share = Histogram(
            "shadowpod_migration_duration_policy_ratio",
            "A finished migration's duration divided by its policy's maxDurationSeconds.",
            buckets=POLICY_SHARE_BUCKETS,
            registry=r,
        )
        # Every result's series exists from the start at 0: a first slow or failed
        # migration is an increase an alert sees, not a new series whose first sample
        # is already 1 (which increase() cannot tell from one that was always there).
        for result in RESULTS:
            self.migration_duration.labels(result=result)
        self.phase_duration = Histogram(
            "shadowpod_migration_phase_duration_seconds",
            "Time a migration spent in each phase.",
            ["phase"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.fence_pause = Histogram(
            "shadowpod_migration_fence_pause_seconds",
            "How long the first message held back by a migration's fence waited for the new owner.",
            buckets=PAUSE_BUCKETS,
            registry=r,
        )
        self.in_progress = Gauge(
            "shadowpod_migrations_in_progress",
            "Migrations started and not finished, by phase.",
            ["phase"],
            registry=r,
        )
        self.phase_entered = Gauge(
            "shadowpod_migration_phase_entered_timestamp_seconds",
            "When the oldest migration now in each phase entered it (0 when none is): "
            "time() minus this is how long one has been stuck there.",
            ["phase"],
            registry=r,
        )
        # migration id: (phase, when it entered it), for the migrations not finished.
        self._phases: dict[str, tuple[str, float]] = {}
        self.sessions = Gauge(
            "shadowpod_sessions",
            "AgentSessions, by phase (Pending, Running, Migrating, Suspended, Resuming).",
            ["phase"],
            registry=r,
        )
        self.sessions_without_owner = Gauge(
            "shadowpod_sessions_without_ready_owner",
            "AgentSessions whose owner pod is not Ready.",
            registry=r,
        )
        self.reconcile_errors = Counter(
            "shadowpod_reconcile_errors",
            "Reconciles that failed, by kind (AgentSession, AgentMigration, Node) and reason.",
            ["kind", "reason"],
            registry=r,
        )
        self.validation_turns = Counter(
            "shadowpod_validation_turns_compared",
            "Turns an upgrade gate compared, by judge and by what was compared (live turns,"
            " or a golden session).",
            ["judge", "source"],
            registry=r,
        )
        self.validation_agreement = Histogram(
            "shadowpod_validation_agreement_ratio",
            "The share of compared turns an upgrade gate found in agreement, one observation"
            " per comparison (live turns, or a golden session).",
            ["source"],
            buckets=AGREEMENT_BUCKETS,
            registry=r,
        )
        self.validation_rollbacks = Counter(
            "shadowpod_migrations_rolled_back_by_validation",
            "Migrations an upgrade gate rolled back, by reason: ValidationFailed (the target"
            " answered worse), ValidationUnavailable (the comparison could not be made) or"
            " PersonaDrift (the target no longer says who the agent is).",
            ["reason"],
            registry=r,
        )
        # Both series exist from the start at 0: the first rollback is an increase an
        # alert can see, not a new series whose first sample is already 1.
        for reason in ("ValidationFailed", "ValidationUnavailable", "PersonaDrift"):
            self.validation_rollbacks.labels(reason=reason)
        self.migrations_queued = Gauge(
            "shadowpod_migrations_queued",
            "Migrations waiting in the cluster-wide pacing queue (phase Queued).",
            registry=r,
        )
        self.migrations_admitted = Gauge(
            "shadowpod_migrations_running",
            "Migrations admitted by the pacing queue and not finished: at most"
            " --max-concurrent-migrations.",
            registry=r,
        )
        self.max_concurrent_migrations = Gauge(
            "shadowpod_max_concurrent_migrations",
            "The operator's --max-concurrent-migrations.",
            registry=r,
        )
        self.rollouts = Gauge(
            "shadowpod_rollouts",
            "AgentDeployments by their rollout's phase (Progressing, Paused, Halted,"
            " Aborting, Aborted, Complete).",
            ["phase"],
            registry=r,
        )
        # Every phase's series exists from the start at 0, for the rollout alerts.
        for phase in RolloutPhase:
            self.rollouts.labels(phase=phase.value)
        self.rollout_migrations = Counter(
            "shadowpod_rollout_migrations",
            "Migrations rollouts created, by why: Rollout (forward) or Abort (back).",
            ["direction"],
            registry=r,
        )
        self.build_info = Gauge(
            "shadowpod_build_info",
            "Always 1; the labels say which build runs.",
            ["version"],
            registry=r,
        )
        self.build_info.labels(version=__version__).set(1)

    def count_requests(self, api: Callable[[], int], gateway: Callable[[], int]) -> None:
        """``shadowpod_operator_requests_total{to}``: the requests the operator's own
        clients sent to the API server and to the gateway (read when scraped): its
        idle cost, which does not grow with the number of sessions. An operator started
        again with these metrics counts from its new clients."""
        counts: _RequestCounts | None = getattr(self, "_request_counts", None)
        if counts is None:
            self._request_counts = counts = _RequestCounts(api, gateway)
            self.registry.register(counts)
        counts.counts = {"api": api, "gateway": gateway}

    def migration_in_phase(self, migration: str, phase: str | None, entered: float) -> None:
        """Migration ``migration`` entered ``phase`` at ``entered`` (None: it finished):
        each phase's gauge is the oldest entry of the migrations now in it, 0 when none."""
        before = self._phases.pop(migration, None)
        if phase is not None:
            self._phases[migration] = (phase, entered)
        for changed in {p for p in (before[0] if before else None, phase) if p is not None}:
            times = [t for p, t in self._phases.values() if p == changed]
            self.phase_entered.labels(phase=changed).set(min(times) if times else 0)


class _RequestCounts:
    def __init__(self, api: Callable[[], int], gateway: Callable[[], int]) -> None:
        self.counts = {"api": api, "gateway": gateway}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "shadowpod_operator_requests",
            "Requests the operator's clients sent, to the API server or the gateway"
            " (Kopf's watches not included).",
            labels=["to"],
        )
        for to, count in self.counts.items():
            family.add_metric([to], count())
        yield family
