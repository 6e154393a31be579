"""The Grafana dashboard reads only metrics the operator exports, and shows what the
issue asks: migration durations by phase, fence pause, migrations by result, sessions by
phase."""

from __future__ import annotations

import json
import re

from tests.chart.helm import CHART
from tests.chart.series import metric_names

DASHBOARD = CHART / "dashboards" / "shadowpod.json"


def expressions() -> dict[str, list[str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        panel["title"]: [target["expr"] for target in panel["targets"]]
        for panel in dashboard["panels"]
    }


def test_every_expression_reads_a_metric_the_operator_exports() -> None:
    exported = metric_names()
    panels = expressions()
    assert panels
    for title, exprs in panels.items():
        assert exprs, f"panel {title!r} has no query"
        for expr in exprs:
            read = set(re.findall(r"\b(shadowpod_\w+)\{", expr))
            assert read, f"{title!r}: {expr} reads no shadowpod metric"
            assert read <= exported, f"{title!r}: {sorted(read - exported)} are not exported"
            assert 'namespace="$namespace"' in expr


def test_the_panels_the_issue_asks_for_are_there() -> None:
    panels = expressions()
    joined = {title: " ".join(exprs) for title, exprs in panels.items()}

    def panel_reading(metric: str, by: str) -> list[str]:
        return [
            t
            for t, e in joined.items()
            if (metric in e and f"by (le, {by})" in e) or (metric in e and f"by ({by})" in e)
        ]

    assert panel_reading("shadowpod_migration_phase_duration_seconds_bucket", "phase")
    assert [t for t, e in joined.items() if "shadowpod_migration_fence_pause_seconds_bucket" in e]
    assert panel_reading("shadowpod_migrations_total", "result")
    assert panel_reading("shadowpod_sessions", "phase")
