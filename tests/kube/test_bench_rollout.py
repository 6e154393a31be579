"""`shadowpod bench rollout` end to end on the emulator: a fleet following one
AgentDeployment on a hollow node whose agents run in the benchmark's process, its
image bumped, the rollout run to Complete through the operator's pacing queue.

What a user of the benchmark would notice going wrong: a fleet that never comes up on
the hollow node, a rollout that does not complete (a move whose shadow never serves),
caps exceeded, a probe's message lost, doubled or reordered, missing figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowpod.bench.rollout import RolloutBenchConfig, run_rollout_bench
from tests.kube.connection import KubeConnection

pytestmark = pytest.mark.timeout(900)


async def test_the_rollout_bench_moves_every_session_to_the_new_version(
    emulator_kube: KubeConnection, tmp_path: Path
) -> None:
    out = tmp_path / "rollout.json"
    config = RolloutBenchConfig(
        kubeconfig=emulator_kube.kubeconfig,
        sessions=4,
        nodes=1,
        probes=2,
        rate=2.0,
        window_s=3.0,
        sample_s=1.0,
        workdir=tmp_path / "work",
        out=out,
        up_timeout_s=240.0,
        timeout_s=600.0,
        hollow_schedules=True,
    )
    report = await run_rollout_bench(config)

    assert report["complete"] and json.loads(out.read_text())["complete"]
    assert "error" not in report["fleet"], report["fleet"]
    rollout, client = report["rollout"], report["client"]
    # Every session moved, each by a migration that succeeded, within the caps.
    assert rollout["phase"] == "Complete", rollout
    assert rollout["migrations"] == {"Succeeded": 4}, rollout["migrations"]
    assert rollout["caps_kept"] and 1 <= rollout["in_flight_most_per_node"] <= 2, rollout
    assert rollout["in_flight_most"] == rollout["in_flight_most_per_node"]  # one node
    assert rollout["in_flight_over_time"], rollout
    # The probes were answered by both versions, each message once and in order.
    assert client["sent"] > 0 and client["lost"] == client["duplicated"] == 0
    assert client["reordered"] == 0
    assert set(client["versions"]) == {"1", "2"}, client["versions"]
    assert client["latency_before_s"]["n"] > 0 and client["latency_during_s"]["n"] > 0
    # The operator's figures, before and during.
    for window in (report["before"], rollout):
        assert window["operator_rss_mb"] > 0 and window["operator_cpu_percent"] is not None
        assert window["operator_api_requests_per_s"] >= 0
    assert rollout["operator_api_requests_per_s"] > 0
    assert all(not node["failures"] for node in report["hollow_nodes"].values()), report
    assert all(target["met"] for target in report["targets"].values()), report["targets"]
