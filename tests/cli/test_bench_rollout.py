"""How `shadowpod bench rollout` counts migrations in flight against the caps: from
AgentMigrations as its watch last showed them, neither Queued nor finished, in the
cluster and out of each session's node (as the pacing queue counts them); and the
command's refusal without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from shadowpod.bench.rollout import Migrations
from shadowpod.cli.main import cli


def migration(name: str, phase: str | None, result: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {} if phase is None else {"phase": phase}
    if result is not None:
        status["result"] = result
    return {"metadata": {"name": name}, "spec": {"sessionRef": {"name": name}}, "status": status}


def session(name: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {} if node is None else {"nodeName": node}}


def test_in_flight_counts_neither_queued_nor_finished_moves_by_source_node() -> None:
    flight = Migrations()
    nodes = ["node-2", "node-1", "node-1", "node-1", "node-2", "node-2", "node-1"]
    for name, node in zip("abcdefg", nodes, strict=True):
        flight.on_session("ADDED", session(name, node), 0.0)
    for body in [
        migration("a", None),  # not yet seen by its daemon
        migration("b", "Queued"),
        migration("c", "Restoring"),
        migration("d", "CatchingUp"),
        migration("e", "Pending"),
        migration("f", "Succeeded", "Succeeded"),
        migration("g", "RolledBack", "RolledBack"),
    ]:
        flight.on_event("ADDED", body, 0.0)
    flight.sample(1.0)
    for name in "bcdeg":
        flight.on_event("DELETED", migration(name, None), 0.0)
    flight.on_event("MODIFIED", migration("a", "Fencing"), 0.0)
    flight.sample(2.0)
    assert flight.samples == [(1.0, 3, 2), (2.0, 1, 1)]
    assert (flight.most, flight.most_per_node) == (3, 2)
    assert flight.outcomes() == {"unfinished": 1, "Succeeded": 1}


def test_without_a_cluster_it_says_so_and_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "rollout", "--kubeconfig", str(tmp_path / "none"), "--sessions", "2"]
    )
    assert result.exit_code == 2
    assert "no kubeconfig at" in result.output and "make cluster" in result.output
