"""ShadowpodJournalNamespaceLarge under `promtool test rules`, fed with what the
gateway's real metric (``shadowpod_journal_entries``, rendered by GatewayMetrics as
``/metrics`` renders it) would have shown Prometheus minute by minute, from two gateway
replicas sharing one journal (each reports all of it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shadowpod.gateway.metrics import GatewayMetrics
from tests.chart.helm import NAMESPACE, RELEASE
from tests.chart.test_alerts import PROMTOOL, RUNBOOK, promtool, rendered_rules, rules

__all__ = ["rendered_rules", "rules"]  # the fixtures, shared with test_alerts
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed: `apt-get install prometheus` (Debian) provides it",
)

LIMIT = 20_000_000  # the chart's default journalNamespaceEntries


def _series(minutes: int, sizes: Callable[[int], dict[str, int]]) -> list[dict[str, Any]]:
    points: dict[str, list[str]] = {}
    for minute in range(minutes + 1):
        metrics = GatewayMetrics()
        for namespace, entries in sizes(minute).items():
            metrics.journal_entries.labels(session_namespace=namespace).set(entries)
        text = generate_latest(metrics.registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != "shadowpod_journal_entries":
                    continue
                for replica in ("10.0.0.8:8080", "10.0.0.9:8080"):
                    labels = {
                        **sample.labels,
                        "job": f"{RELEASE}-shadowpod-gateway",
                        "namespace": NAMESPACE,
                        "instance": replica,
                    }
                    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    key = f"{sample.name}{{{inner}}}"
                    points.setdefault(key, ["_"] * minute).append(str(sample.value))
    return [{"series": key, "values": " ".join(values)} for key, values in points.items()]


def _check(rules: Path, sizes: Callable[[int], dict[str, int]], at: int, fired: list[str]) -> None:
    expected = [
        {
            "exp_labels": {"severity": "warning", "session_namespace": namespace},
            "exp_annotations": {
                "summary": f"The sessions of namespace {namespace} hold more than {LIMIT}"
                " journal entries.",
                "description": f"{value} entries: their journals grow faster than retention"
                " truncates them (spec.checkpoint: intervalEntries, retainSnapshots).",
                "runbook_url": f"{RUNBOOK}#shadowpodjournalnamespacelarge",
            },
        }
        for namespace, value in (f.split("=") for f in fired)
    ]
    case = {
        "interval": "1m",
        "input_series": _series(at, sizes),
        "alert_rule_test": [
            {
                "eval_time": f"{at}m",
                "alertname": "ShadowpodJournalNamespaceLarge",
                "exp_alerts": expected,
            }
        ],
    }
    tests = rules.parent / "journal-tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "tests": [case]}))
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr


def growing(minute: int) -> dict[str, int]:
    """team-a passes the limit at minute 10 and keeps growing; team-b stays small."""
    return {"team-a": 19_000_000 + 100_000 * minute, "team-b": 5_000}


def test_a_namespace_past_the_limit_for_30_minutes_fires_once_for_that_namespace(
    rules: Path,
) -> None:
    _check(rules, growing, 45, ["team-a=23.5M"])
    _check(rules, growing, 39, [])  # past the limit since minute 11: not 30 minutes yet


def test_a_namespace_whose_retention_cuts_it_back_stops_firing(rules: Path) -> None:
    def truncated(minute: int) -> dict[str, int]:
        return growing(minute) if minute < 50 else {"team-a": 2_000_000, "team-b": 5_000}

    _check(rules, truncated, 49, ["team-a=23.9M"])
    _check(rules, truncated, 52, [])
