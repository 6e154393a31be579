"""Prometheus series for promtool, made by the operator's real metrics.

A scenario drives an ``OperatorMetrics`` (operator/shadowpod/kube/metrics.py) minute by
minute; after each minute its registry is rendered as ``/metrics`` is and parsed back,
and every sample becomes a point of a series, labelled as a ServiceMonitor scrape labels
it. A renamed metric, label or bucket changes the series, and the alert tests see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shadowpod.gateway.metrics import GatewayMetrics
from shadowpod.kube.metrics import OperatorMetrics

Step = Callable[[int, OperatorMetrics], None]


def exposition(metrics: OperatorMetrics) -> dict[str, float]:
    """Every sample ``/metrics`` shows now, keyed by its series selector."""
    text = generate_latest(metrics.registry).decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # creation times: no rule reads them
            samples[selector(sample.name, sample.labels)] = sample.value
    return samples


def selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def metric_names() -> set[str]:
    """The names of every series the operator exports (histograms' _bucket, _sum, _count;
    counters' _total), from a registry with one of each labelled child."""
    metrics = OperatorMetrics()
    metrics.migrations.labels(result="Succeeded", reason="ImageChanged").inc()
    metrics.migration_duration.labels(result="Succeeded").observe(1)
    metrics.phase_duration.labels(phase="Fencing").observe(1)
    metrics.fence_pause.observe(0.01)
    metrics.in_progress.labels(phase="Fencing").set(0)
    metrics.phase_entered.labels(phase="Fencing").set(0)
    metrics.sessions.labels(phase="Running").set(1)
    metrics.reconcile_errors.labels(kind="AgentSession", reason="Conflict").inc()
    metrics.validation_turns.labels(judge="semantic", source="live").inc(5)
    metrics.validation_agreement.labels(source="live").observe(0.8)
    metrics.validation_rollbacks.labels(reason="ValidationFailed").inc()
    return {key.split("{", 1)[0] for key in exposition(metrics)}


def scrape(
    minutes: int, step: Step, *, scrape_labels: dict[str, str], up: Callable[[int], float | None]
) -> list[dict[str, Any]]:
    """promtool ``input_series``: ``minutes + 1`` points a minute apart (0 … minutes).

    ``step(minute, metrics)`` changes the metrics before the scrape at that minute.
    ``up(minute)`` is the scrape's ``up`` (None: the target was not there at all).
    """
    metrics = OperatorMetrics()
    points: dict[str, list[str]] = {}
    up_points: list[str] = []
    for minute in range(minutes + 1):
        step(minute, metrics)
        value = up(minute)
        up_points.append("_" if value is None else repr(value))
        scraped = exposition(metrics) if value == 1 else {}
        for key in scraped:
            points.setdefault(key, ["_"] * minute)
        for key, values in points.items():
            values.append(repr(scraped[key]) if key in scraped else "_")
    job_labels = ",".join(f'{key}="{value}"' for key, value in sorted(scrape_labels.items()))

    def labelled(key: str) -> str:
        name, inner = key.split("{", 1)
        inner = inner.rstrip("}")
        return f"{name}{{{job_labels}{',' if inner else ''}{inner}}}"

    series = [
        {"series": labelled(key), "values": " ".join(values)} for key, values in points.items()
    ]
    series.append({"series": f"up{{{job_labels}}}", "values": " ".join(up_points)})
    return series


def gateway_metric_names() -> set[str]:
    """The names of the series the gateway exports that the chart's rules read."""
    metrics = GatewayMetrics()
    metrics.journal_entries.labels(session_namespace="default").set(1)
    metrics.journal_sessions.labels(session_namespace="default").set(1)
    text = generate_latest(metrics.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}
