"""`shadowpod bench cluster-scale` end to end on the emulator: the hollow node takes
the pods the operator makes (bound by itself here: the emulator has no scheduler), says
them Running and Ready, and the benchmark measures the operator at rest at each step
and an image change → AgentMigration per bumped session.

What a user of the benchmark would notice going wrong: sessions that never get
Running on the hollow node, a step whose idle figures are missing, a bump that finds
no AgentMigration, or an operator that keeps polling steady sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowpod.bench.cluster_scale import ScaleBenchConfig, run_scale_bench
from tests.kube.connection import KubeConnection

pytestmark = pytest.mark.timeout(300)


async def test_the_scale_bench_measures_steady_sessions_at_each_step(
    emulator_kube: KubeConnection, tmp_path: Path
) -> None:
    out = tmp_path / "scale.json"
    config = ScaleBenchConfig(
        kubeconfig=emulator_kube.kubeconfig,
        steps=(3, 6),
        rate=20.0,
        bumped=2,
        bump_at=frozenset({3}),
        window_s=3.0,
        settle_s=1.0,
        quiet_max_s=60.0,
        step_timeout_s=120.0,
        reconcile_interval_s=1.0,
        workdir=tmp_path / "work",
        out=out,
        hollow_schedules=True,
    )
    report = await run_scale_bench(config)

    assert report["complete"] and json.loads(out.read_text())["complete"]
    assert [s["sessions"] for s in report["steps"]] == [3, 6]
    for step in report["steps"]:
        assert step["every_session_running"], step
        assert step["running"] == step["sessions"]
        assert step["settle"]["went_quiet"], step
        idle = step["idle"]
        # Steady sessions keep no periodic pass: the operator asks the API server for
        # nothing while nothing changes, and the gateway for its one look a period.
        assert idle["sessions_keeping_periodic_passes"] == {"before": 0, "after": 0}
        assert idle["operator_api_requests_per_s"] == 0
        assert 0 < idle["operator_gateway_requests_per_s"] <= 3
        assert idle["rss_mb"]["operator"]["rss"] > 0
    # After the step asked for and after the last: each bumped session got its move.
    assert [b["sessions"] for b in report["bumps"]] == [3, 6]
    for bump in report["bumps"]:
        assert bump["bumped"] == 2 and bump["every_migration_made"], bump
        assert bump["image_change_to_migration_s"]["n"] == 2
        # Nothing answers for a hollow pod's agent: each move is undone, none succeeds.
        assert bump["every_migration_ended"] and "Succeeded" not in bump["migrations_ended"]
    assert report["hollow_node"]["failures"] == {}
