"""The chart's alerts, as Helm renders them, under `promtool test rules`, fed with what
the operator's real metrics would have shown Prometheus minute by minute."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from shadowpod.kube.metrics import OperatorMetrics
from tests.chart.conftest import render
from tests.chart.helm import NAMESPACE, RELEASE
from tests.chart.series import Step, metric_names, scrape

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed: `apt-get install prometheus` (Debian) provides it",
)
# A ServiceMonitor scrape of the operator's metrics Service labels its series so.
SCRAPE = {
    "job": f"{RELEASE}-shadowpod-operator-metrics",
    "namespace": NAMESPACE,
    "instance": "10.0.0.7:9090",
    "pod": f"{RELEASE}-shadowpod-operator-5d9c7-abcde",
}
ALERTS = [
    "ShadowpodMigrationSlow",
    "ShadowpodMigrationsFailing",
    "ShadowpodMigrationStuck",
    "ShadowpodFencePauseHigh",
    "ShadowpodUpgradeGateUnavailable",
    "ShadowpodSessionWithoutReadyOwner",
    "ShadowpodOperatorAbsent",
]
RUNBOOK = "https://github.com/shadowpod/shadowpod/blob/main/docs/runbooks.md"


@pytest.fixture(scope="module")
def rendered_rules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The PrometheusRule's spec as Helm renders it (one install for the module)."""
    values = {"metrics": {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}}
    rendered = asyncio.run(render(values, tmp_path_factory.mktemp("cluster")))
    spec: dict[str, Any] = rendered.one("PrometheusRule", f"{RELEASE}-shadowpod")["spec"]
    return spec


@pytest.fixture
def rules(rendered_rules: dict[str, Any], tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rendered_rules))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


def run_case(
    rules: Path,
    minutes: int,
    step: Step,
    expected: dict[str, list[dict[str, Any]]],
    *,
    eval_minute: int,
    up: Callable[[int], float | None] = lambda minute: 1,
) -> None:
    """Every alert is checked at ``eval_minute``: those not in ``expected`` must not fire."""
    case = {
        "interval": "1m",
        "input_series": scrape(minutes, step, scrape_labels=SCRAPE, up=up),
        "alert_rule_test": [
            {
                "eval_time": f"{eval_minute}m",
                "alertname": name,
                "exp_alerts": expected.get(name, []),
            }
            for name in ALERTS
        ],
    }
    tests = rules.parent / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "tests": [case]}))
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr


def alert(
    severity: str, anchor: str, summary: str, description: str, **labels: str
) -> dict[str, Any]:
    return {
        "exp_labels": {"severity": severity, **labels},
        "exp_annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{RUNBOOK}#{anchor}",
        },
    }


def migrations(duration: float, pause: float, every: int = 5, failing_every: int = 0) -> Step:
    """A migration finishes every ``every`` minutes (one in ``failing_every`` rolls back)."""

    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(3)
        metrics.sessions_without_owner.set(0)
        if minute == 0 or minute % every:
            return
        number = minute // every
        failed = failing_every and number % failing_every == 0
        result = "RolledBack" if failed else "Succeeded"
        reason = "AgentNotReady" if failed else "ImageChanged"
        metrics.migrations.labels(result=result, reason=reason).inc()
        metrics.migration_duration.labels(result=result).observe(duration)
        for phase in ("Shadowing", "CatchingUp", "Fencing", "HandingOver"):
            metrics.phase_duration.labels(phase=phase).observe(duration / 4)
        metrics.fence_pause.observe(pause)

    return step


def test_the_rules_are_valid_and_read_only_metrics_the_operator_exports(rules: Path) -> None:
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exported = metric_names() | {"up"}
    groups = yaml.safe_load(rules.read_text())["groups"]
    read = {
        name
        for group in groups
        for rule in group["rules"]
        for name in re.findall(r"\b(shadowpod_\w+|up)\{", rule["expr"])
    }
    assert read, "no metric found in the rules"
    assert read <= exported, f"rules read metrics the operator does not export: {read - exported}"


def test_a_healthy_cluster_raises_nothing(rules: Path) -> None:
    run_case(rules, 90, migrations(duration=8, pause=0.02), {}, eval_minute=90)


def test_slow_migrations_fire_after_fifteen_minutes(rules: Path) -> None:
    expected = {
        "ShadowpodMigrationSlow": [
            alert(
                "warning",
                "shadowpodmigrationslow",
                "Migrations take longer than 120 s (p95 over the last hour).",
                # 250 s falls in the (120, 300] bucket: Prometheus interpolates 291 s.
                "The 95th percentile of migration durations is 4m 51s.",
            )
        ]
    }
    run_case(rules, 60, migrations(duration=250, pause=0.02), expected, eval_minute=60)
    # Not before they have been slow for 15 minutes.
    run_case(rules, 60, migrations(duration=250, pause=0.02), {}, eval_minute=15)


def test_a_failure_ratio_above_the_threshold_fires(rules: Path) -> None:
    expected = {
        "ShadowpodMigrationsFailing": [
            alert(
                "warning",
                "shadowpodmigrationsfailing",
                "More than 10% of migrations in the last hour did not succeed.",
                "33.33% of the last hour's migrations rolled back or failed.",
            )
        ]
    }
    step = migrations(duration=8, pause=0.02, failing_every=3)
    run_case(rules, 90, step, expected, eval_minute=90)


def test_a_migration_stuck_in_one_phase_fires_with_its_phase(rules: Path) -> None:
    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Migrating").set(1)
        if minute == 5:  # entered Fencing at minute 5 and never left
            metrics.in_progress.labels(phase="Fencing").set(1)
            metrics.phase_entered.labels(phase="Fencing").set(5 * 60)
        metrics.phase_entered.labels(phase="Shadowing").set(0)  # none there

    expected = {
        "ShadowpodMigrationStuck": [
            alert(
                "critical",
                "shadowpodmigrationstuck",
                "A migration has been in phase Fencing for more than 900 s.",
                "The oldest migration in Fencing entered it 25m 0s ago.",
                phase="Fencing",
                **SCRAPE,
            )
        ]
    }
    run_case(rules, 30, step, expected, eval_minute=30)
    run_case(rules, 30, step, {}, eval_minute=19)  # 14 minutes in: not yet


def test_long_fence_pauses_fire(rules: Path) -> None:
    expected = {
        "ShadowpodFencePauseHigh": [
            alert(
                "warning",
                "shadowpodfencepausehigh",
                "Clients wait more than 1 s at a migration's fence (p99 over the last hour).",
                # 3 s falls in the (2.5, 5] bucket: 2.5 + 0.99 * 2.5.
                "The 99th percentile of fence pauses is 4.975s.",
            )
        ]
    }
    run_case(rules, 60, migrations(duration=8, pause=3.0), expected, eval_minute=60)


def gated_upgrades(reason: str) -> Step:
    """Upgrades every 5 minutes, each rolled back by its upgrade gate with ``reason``."""

    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(3)
        if minute == 0 or minute % 5:
            return
        metrics.migrations.labels(result="RolledBack", reason=reason).inc()
        metrics.migration_duration.labels(result="RolledBack").observe(20)
        metrics.validation_rollbacks.labels(reason=reason).inc()
        if reason == "ValidationFailed":
            metrics.validation_turns.labels(judge="semantic", source="live").inc(5)
            metrics.validation_agreement.labels(source="live").observe(0.6)

    return step


def test_upgrades_a_gate_rejects_are_no_failing_migrations(rules: Path) -> None:
    # The gate doing its job (a version that answers worse stays out) pages nobody.
    run_case(rules, 90, gated_upgrades("ValidationFailed"), {}, eval_minute=90)


def test_a_gate_that_cannot_judge_fires_at_once(rules: Path) -> None:
    gate = alert(
        "warning",
        "shadowpodupgradegateunavailable",
        "An upgrade gate could not judge a migration in the last hour: it rolled back.",
        "A migration rolled back with ValidationUnavailable: the judge's model or endpoint,"
        " a golden ConfigMap or a shadow's agent API could not be used; image changes gated"
        " by it do not land.",
    )
    failing = alert(
        "warning",
        "shadowpodmigrationsfailing",
        "More than 10% of migrations in the last hour did not succeed.",
        "100% of the last hour's migrations rolled back or failed.",
    )
    expected = {"ShadowpodUpgradeGateUnavailable": [gate], "ShadowpodMigrationsFailing": [failing]}
    run_case(rules, 30, gated_upgrades("ValidationUnavailable"), expected, eval_minute=30)
    run_case(rules, 30, gated_upgrades("ValidationUnavailable"), {}, eval_minute=4)


def test_a_session_without_a_ready_owner_fires_after_five_minutes(rules: Path) -> None:
    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(2)
        # A blip at minutes 3-5 (a pod restarting), then down from minute 10.
        metrics.sessions_without_owner.set(1 if 3 <= minute <= 5 or minute >= 10 else 0)

    expected = {
        "ShadowpodSessionWithoutReadyOwner": [
            alert(
                "critical",
                "shadowpodsessionwithoutreadyowner",
                "1 AgentSession(s) have had no Ready owner pod for 5m.",
                "Their messages are journaled but nobody answers them.",
            )
        ]
    }
    run_case(rules, 20, step, {}, eval_minute=8)
    run_case(rules, 20, step, expected, eval_minute=16)


def test_an_operator_that_is_not_scraped_fires(rules: Path) -> None:
    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(1)

    expected = {
        "ShadowpodOperatorAbsent": [
            alert(
                "critical",
                "shadowpodoperatorabsent",
                f"The Shadowpod operator in {NAMESPACE} has not been scraped for 5m.",
                "No AgentSession is reconciled and no migration advances while it is away.",
                job=SCRAPE["job"],
                namespace=NAMESPACE,
            )
        ]
    }
    gone = lambda minute: 1 if minute < 10 else None  # noqa: E731 - the pod went away
    failing = lambda minute: 1 if minute < 10 else 0  # noqa: E731 - scrapes fail
    # Scrapes fail from minute 10: absent from then, firing 5 minutes later.
    run_case(rules, 25, step, {}, eval_minute=14, up=failing)
    run_case(rules, 25, step, expected, eval_minute=16, up=failing)
    # The target is gone from minute 10: promtool writes no staleness marker, so the
    # last sample counts for the 5-minute lookback, and the alert fires 5 minutes later.
    run_case(rules, 25, step, {}, eval_minute=18, up=gone)
    run_case(rules, 25, step, expected, eval_minute=20, up=gone)
