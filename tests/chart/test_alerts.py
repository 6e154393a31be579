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

from shadowpod.engine.record import SHADOW_PHASES, MigrationPolicy, Phase
from shadowpod.fleet.progress import RolloutPhase
from shadowpod.kube.metrics import OperatorMetrics
from tests.chart.conftest import render
from tests.chart.helm import NAMESPACE, RELEASE
from tests.chart.series import Step, gateway_metric_names, metric_names, scrape

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
    "ShadowpodFencePauseHigh",
    "ShadowpodMigrationSlow",
    "ShadowpodMigrationStuck",
    "ShadowpodMigrationRollbackRateHigh",
    "ShadowpodUpgradeGateUnavailable",
    "ShadowpodRolloutHalted",
    "ShadowpodRolloutStalled",
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


MAX_DURATION_S = MigrationPolicy().max_duration_s


def finished(
    metrics: OperatorMetrics, duration: float, pause: float | None, result: str, reason: str
) -> None:
    """What the operator records when a migration ends (kube/records.py)."""
    metrics.migrations.labels(result=result, reason=reason).inc()
    metrics.migration_duration.labels(result=result).observe(duration)
    metrics.migration_policy_share.observe(duration / MAX_DURATION_S)
    for phase in SHADOW_PHASES[:-1]:
        metrics.phase_duration.labels(phase=phase).observe(duration / len(SHADOW_PHASES))
    if pause is not None:
        metrics.fence_pause.observe(pause)


def migrations(
    duration: float,
    pause: float,
    every: int = 5,
    failing_every: int = 0,
    slow: dict[int, float] | None = None,
    paused: dict[int, float] | None = None,
) -> Step:
    """A migration finishes every ``every`` minutes (one in ``failing_every`` rolls
    back); ``slow`` and ``paused``: {minute: its duration, or its fence pause}."""

    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(3)
        metrics.sessions_without_owner.set(0)
        if minute == 0 or minute % every:
            return
        number = minute // every
        failed = failing_every and number % failing_every == 0
        result = "RolledBack" if failed else "Succeeded"
        reason = "AgentNotReady" if failed else "ImageChanged"
        took = (slow or {}).get(minute, duration)
        finished(
            metrics, took, None if failed else (paused or {}).get(minute, pause), result, reason
        )

    return step


def test_the_rules_are_valid_and_read_only_metrics_the_operator_exports(rules: Path) -> None:
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exported = metric_names() | gateway_metric_names() | {"up"}
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


def slow_alert(count: str) -> dict[str, Any]:
    return alert(
        "warning",
        "shadowpodmigrationslow",
        "A migration in the last hour took more than 50% of its policy's maxDurationSeconds.",
        f"{count} migration(s) in the last hour took more than 50% of the time their"
        " policy allows (maxDurationSeconds).",
    )


def test_one_slow_migration_among_fast_ones_fires_at_once(rules: Path) -> None:
    """Migrations take 8 s; one at minute 30 takes 70 s of the policy's 120 (58%)."""
    step = migrations(duration=8, pause=0.02, slow={30: 70})
    run_case(rules, 90, step, {"ShadowpodMigrationSlow": [slow_alert("1")]}, eval_minute=31)
    run_case(rules, 90, step, {"ShadowpodMigrationSlow": [slow_alert("1")]}, eval_minute=85)
    run_case(rules, 90, step, {}, eval_minute=29)  # not before it
    run_case(rules, 95, step, {}, eval_minute=95)  # nor an hour after


def test_a_migration_within_half_its_policy_raises_nothing(rules: Path) -> None:
    # 59 s of 120: slower than the others, within the budget the threshold leaves.
    run_case(rules, 60, migrations(duration=8, pause=0.02, slow={30: 59}), {}, eval_minute=31)


def test_the_first_migration_of_an_operator_is_seen_too(rules: Path) -> None:
    """The series exist at 0 from the operator's start: a first migration that is
    slow, or rolled back, is an increase (a new series' first sample would not be)."""

    def step(minute: int, metrics: OperatorMetrics) -> None:
        if minute == 10:
            finished(metrics, 100, 0.02, "RolledBack", "AgentNotReady")

    expected = {
        "ShadowpodMigrationSlow": [slow_alert("1")],
        "ShadowpodMigrationRollbackRateHigh": [rollback_alert("100%")],
    }
    run_case(rules, 30, step, expected, eval_minute=25)


def rollback_alert(share: str) -> dict[str, Any]:
    return alert(
        "warning",
        "shadowpodmigrationrollbackratehigh",
        "More than 10% of migrations in the last hour rolled back or failed.",
        f"{share} of the last hour's migrations rolled back or failed (upgrade gates'"
        " rejections apart).",
    )


def test_a_rollback_rate_above_the_threshold_fires(rules: Path) -> None:
    expected = {"ShadowpodMigrationRollbackRateHigh": [rollback_alert("33.33%")]}
    step = migrations(duration=8, pause=0.02, failing_every=3)
    run_case(rules, 90, step, expected, eval_minute=90)


def test_a_migration_stuck_in_one_phase_fires_with_its_phase(rules: Path) -> None:
    """Two migrations: one passes through Fencing, one enters it at minute 5 and stays;
    the gauge the operator keeps is the oldest one still there."""

    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Migrating").set(1)
        if minute == 2:
            metrics.migration_in_phase("a", Phase.CATCHING_UP, 2 * 60)
        if minute == 3:
            metrics.migration_in_phase("a", Phase.FENCING, 3 * 60)
        if minute == 4:
            metrics.migration_in_phase("a", Phase.COMMITTED, 4 * 60)
            metrics.migration_in_phase("a", None, 0)
        if minute == 5:
            metrics.migration_in_phase("b", Phase.FENCING, 5 * 60)

    expected = {
        "ShadowpodMigrationStuck": [
            alert(
                "critical",
                "shadowpodmigrationstuck",
                "A migration has been in phase Fencing for more than 300 s.",
                "The oldest migration in Fencing entered it 10m 0s ago.",
                phase=Phase.FENCING.value,
                **SCRAPE,
            )
        ]
    }
    run_case(rules, 15, step, expected, eval_minute=15)
    run_case(rules, 15, step, {}, eval_minute=9)  # 4 minutes in: not yet


def pause_alert(count: str) -> dict[str, Any]:
    return alert(
        "warning",
        "shadowpodfencepausehigh",
        "A client waited more than 1 s at a migration's fence in the last 15 minutes.",
        f"{count} migration(s) held a client's message back at the fence longer than 1 s"
        " (the pause clients feel).",
    )


def test_one_long_fence_pause_fires(rules: Path) -> None:
    """Pauses of 20 ms; the migration at minute 30 held a message 3 s."""
    step = migrations(duration=8, pause=0.02, paused={30: 3.0})
    run_case(rules, 60, step, {"ShadowpodFencePauseHigh": [pause_alert("1")]}, eval_minute=31)
    run_case(rules, 60, step, {}, eval_minute=29)
    run_case(rules, 60, step, {}, eval_minute=50)  # 20 minutes later: over


def test_fence_pauses_under_the_threshold_raise_nothing(rules: Path) -> None:
    run_case(rules, 60, migrations(duration=8, pause=0.9), {}, eval_minute=60)


def gated_upgrades(reason: str) -> Step:
    """Upgrades every 5 minutes, each rolled back by its upgrade gate with ``reason``."""

    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(3)
        if minute == 0 or minute % 5:
            return
        finished(metrics, 20, None, "RolledBack", reason)
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
    expected = {
        "ShadowpodUpgradeGateUnavailable": [gate],
        "ShadowpodMigrationRollbackRateHigh": [rollback_alert("100%")],
    }
    run_case(rules, 30, gated_upgrades("ValidationUnavailable"), expected, eval_minute=30)
    run_case(rules, 30, gated_upgrades("ValidationUnavailable"), {}, eval_minute=4)


def test_a_halted_rollout_fires(rules: Path) -> None:
    def step(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(3)
        halted = minute >= 5
        metrics.rollouts.labels(phase="Halted").set(1 if halted else 0)
        metrics.rollouts.labels(phase="Progressing").set(0 if halted else 1)
        if minute in (1, 3):  # the canary's moves: one succeeds, the next is rejected
            result = "Succeeded" if minute == 1 else "RolledBack"
            finished(metrics, 20.0, 0.05 if minute == 1 else None, result, "ValidationFailed")

    expected = {
        "ShadowpodRolloutHalted": [
            alert(
                "warning",
                "shadowpodrollouthalted",
                "1 AgentDeployment rollout(s) halted: more migrations of a step failed than"
                " its failureBudget.",
                "The other sessions stay on their version, serving; kubectl shadowpod rollout"
                " status names the reason and the sessions.",
            )
        ]
    }
    run_case(rules, 10, step, {}, eval_minute=4)
    run_case(rules, 10, step, expected, eval_minute=7)


def test_a_rollout_that_moves_nothing_for_half_an_hour_fires_one_that_moves_does_not(
    rules: Path,
) -> None:
    def stalled(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(3)
        metrics.rollouts.labels(phase="Progressing").set(1)
        if minute == 2:  # one move, then nothing
            finished(metrics, 20.0, 0.05, "Succeeded", "Rollout")

    expected = {
        "ShadowpodRolloutStalled": [
            alert(
                "warning",
                "shadowpodrolloutstalled",
                "1 AgentDeployment rollout(s) progressing with no migration finished in 30"
                " minutes.",
                "A rollout that should move sessions has moved none for half an hour;"
                " kubectl shadowpod rollout status says what its sessions wait for.",
            )
        ]
    }
    run_case(rules, 60, stalled, {}, eval_minute=40)
    run_case(rules, 60, stalled, expected, eval_minute=50)

    def moving(minute: int, metrics: OperatorMetrics) -> None:
        metrics.sessions.labels(phase="Running").set(3)
        metrics.rollouts.labels(phase="Progressing").set(1)
        if minute % 10 == 0:
            finished(metrics, 20.0, 0.05, "Succeeded", "Rollout")

    run_case(rules, 60, moving, {}, eval_minute=55)


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


RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
TERMINAL = {Phase.SUCCEEDED, Phase.ROLLED_BACK, Phase.FAILED}


def test_the_runbooks_phase_table_is_the_engines_phases() -> None:
    """Every phase a migration can be slow or stuck in has a row, named as the engine
    names it (the runbook once named `Shadowing` and `HandingOver`, which it has not)."""
    table = RUNBOOKS.read_text().split("### Phases", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)
    assert rows == [p.value for p in Phase if p not in TERMINAL]


def test_every_phase_the_alerts_and_runbooks_name_is_the_engines(
    rendered_rules: dict[str, Any],
) -> None:
    phases = {p.value for p in Phase}
    text = RUNBOOKS.read_text() + yaml.safe_dump(rendered_rules)
    # A rollout's phase (shadowpod_rollouts{phase=…}) is an AgentDeployment's, not a
    # migration's: checked against the fleet's phases, then left out of the rest.
    rollout = r'shadowpod_rollouts\{[^}]*phase="(\w+)"'
    named_rollout = set(re.findall(rollout, text))
    assert named_rollout and named_rollout <= {p.value for p in RolloutPhase}, named_rollout
    text = re.sub(rollout, "", text)
    # "phase `Fencing`", "phase is `Fencing` or `Committed`", phase="Fencing", phase: …
    named = {
        name
        for mention in re.findall(
            r"phases?\s+(?:is\s+)?`\w+`(?:(?:,\s*|\s+or\s+|\s+and\s+|/)`\w+`)*", text
        )
        for name in re.findall(r"`(\w+)`", mention)
    }
    named |= set(re.findall(r'phase[=:] ?"?([A-Z][A-Za-z]+)', text))
    assert named, "no phase named"
    assert named <= phases, f"not phases of the engine: {named - phases}"
