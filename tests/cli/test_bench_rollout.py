"""How `shadowpod bench rollout` counts migrations in flight against the caps: from
AgentMigrations as the API lists them, neither Queued nor finished, in the cluster and
out of each source node; and the command's refusal without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from shadowpod.bench.rollout import InFlight
from shadowpod.cli.main import cli


def migration(phase: str | None, node: str | None, result: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {} if phase is None else {"phase": phase}
    if node is not None:
        status["source"] = {"nodeName": node}
    if result is not None:
        status["result"] = result
    return {"metadata": {"name": "m"}, "status": status}


def test_in_flight_counts_neither_queued_nor_finished_moves_by_source_node() -> None:
    flight = InFlight()
    flight.sample(
        1.0,
        [
            migration(None, None),  # not yet seen by its daemon
            migration("Queued", "node-1"),
            migration("Restoring", "node-1"),
            migration("CatchingUp", "node-1"),
            migration("Pending", "node-2"),
            migration("Succeeded", "node-2", "Succeeded"),
            migration("RolledBack", "node-1", "RolledBack"),
        ],
    )
    flight.sample(2.0, [migration("Fencing", "node-2")])
    assert flight.samples == [(1.0, 3, 2), (2.0, 1, 1)]
    assert (flight.most, flight.most_per_node) == (3, 2)
    # What finished is counted from the latest listing (the last sample's).
    assert dict(flight.finished) == {}


def test_without_a_cluster_it_says_so_and_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "rollout", "--kubeconfig", str(tmp_path / "none"), "--sessions", "2"]
    )
    assert result.exit_code == 2
    assert "no kubeconfig at" in result.output and "make cluster" in result.output
