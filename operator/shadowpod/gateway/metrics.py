"""Gateway metrics (prometheus-client). Labels are bounded: never a session name."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The client's default buckets stop at 10 s; a fence pause or wait can be longer.
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
)
LAG_BUCKETS: Final = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.appends = Counter(
            "shadowpod_journal_appends",
            "Journal entries appended, by who wrote them.",
            ["source"],
            registry=r,
        )
        self.duplicates = Counter(
            "shadowpod_duplicate_ids",
            "Appends absorbed because their id was journaled before.",
            ["source"],
            registry=r,
        )
        self.fenced_writes = Counter(
            "shadowpod_fenced_writes_refused",
            "Owner writes refused because their epoch was no longer current.",
            registry=r,
        )
        self.deliveries = Counter(
            "shadowpod_deliveries",
            "Inbound entries released to session owners.",
            registry=r,
        )
        self.fences = Counter(
            "shadowpod_fences",
            "ExchangeFence attempts, by result.",
            ["result"],
            registry=r,
        )
        self.fence_wait = Histogram(
            "shadowpod_fence_wait_seconds",
            "Time an ExchangeFence waited for the owner to finish its turn.",
            buckets=PAUSE_BUCKETS,
            registry=r,
        )
        self.fence_pause = Histogram(
            "shadowpod_fence_pause_seconds",
            "Wait of the first inbound message buffered by a fence, until the new owner got it.",
            buckets=PAUSE_BUCKETS,
            registry=r,
        )
        self.shadow_lag = Histogram(
            "shadowpod_shadow_lag_entries",
            "Entries between the journal head and where a shadow reads from.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.streams = Gauge(
            "shadowpod_open_streams",
            "Open event streams, by kind.",
            ["kind"],
            registry=r,
        )
        self.schedule_fires = Counter(
            "shadowpod_schedule_fires",
            "Schedule fires journaled by this gateway.",
            registry=r,
        )
        # Per namespace, not per session: a session label would make one series per
        # session (unbounded); a session's own size is in GET /v1/sessions/{s}.
        # Per namespace, not per session: a session label would make one series per
        # session (unbounded); a session's own size is in GET /v1/sessions/{s}. The
        # label is not "namespace": Prometheus gives that one to the scraped pod's.
        self.journal_entries = Gauge(
            "shadowpod_journal_entries",
            "Entries the sessions of a namespace hold in their own journals (the session's"
            " meta 'namespace'; '' for sessions made outside Kubernetes).",
            ["session_namespace"],
            registry=r,
        )
        self.journal_sizes_read_at = float("-inf")  # when the figures were last read
        self.journal_sessions = Gauge(
            "shadowpod_journal_sessions",
            "Sessions in the journal, by the namespace of their AgentSession.",
            ["session_namespace"],
            registry=r,
        )
        self.requests = Counter(
            "shadowpod_http_requests",
            "HTTP requests, by route and status code.",
            ["route", "code"],
            registry=r,
        )
