"""Live migrations on a real cluster, as users and the cluster cause them: an image bump
and a node drain under client load (0 lost, 0 duplicated, 0 reordered), a migration
deleted while it runs, the operator killed mid-migration, an owner pod deleted, and the
session deleted at last. The tests run in this order on one session."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.support import (
    GATEWAY,
    NAMESPACE,
    OPERATOR,
    SESSIONS,
    assert_invariants,
    eventually,
    get,
    items,
    owner_pod,
    port_forward,
    start_session,
    under_load,
    wait_condition,
)

SESSION = "load"
IN_FLIGHT = {"Preflight", "Snapshotting", "Restoring", "CatchingUp"}


@pytest.fixture(scope="module")
def running(cluster: Cluster) -> Cluster:
    start_session(cluster, SESSION)
    return cluster


def session_status(cluster: Cluster) -> dict[str, Any]:
    status: dict[str, Any] = get(cluster, "agentsession", SESSION).get("status") or {}
    return status


def migrate(cluster: Cluster, name: str, node: str | None = None) -> None:
    """An AgentMigration of the session (to ``node``, or anywhere else)."""
    target: dict[str, Any] = {"nodeName": node} if node else {}
    cluster.kubectl(
        "apply",
        "-n",
        SESSIONS,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "shadowpod.dev/v1alpha1",
                "kind": "AgentMigration",
                "metadata": {"name": name},
                "spec": {"sessionRef": {"name": SESSION}, "target": target, "reason": "Manual"},
            }
        ),
    )


def phase_of(cluster: Cluster, migration: str) -> str:
    found = items(cluster, "agentmigrations", f"--field-selector=metadata.name={migration}")
    if not found:
        return "Gone"
    return str((found[0].get("status") or {}).get("phase", "Pending"))


def other_node(cluster: Cluster, node: str) -> str:
    return next(n for n in cluster.nodes if n != node)


def test_an_image_bump_migrates_live_under_load(running: Cluster) -> None:
    def bump() -> None:
        running.kubectl(
            "patch",
            "agentsession",
            SESSION,
            "-n",
            SESSIONS,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"image": "shadowpod-refagent:v2"}}),
        )
        generation = get(running, "agentsession", SESSION)["metadata"]["generation"]
        wait_condition(running, f"agentmigration/{SESSION}-g{generation}", "Succeeded", 600)

    with port_forward(running, GATEWAY, 8800) as url:
        load = asyncio.run(under_load(url, SESSION, bump))
    verdict = load.verdict()
    assert_invariants(verdict)
    # Replies from v1 until the cutover, from v2 after it, and no going back.
    assert verdict.version_switches == 1, verdict
    assert len(verdict.versions) == 2, verdict
    assert session_status(running)["image"] == "shadowpod-refagent:v2"


def test_a_drained_node_moves_the_session_live_through_evictions(running: Cluster) -> None:
    """`kubectl drain` evicts through the Eviction API; the owner's PodDisruptionBudget
    holds its eviction until the operator has moved the session off the cordoned node,
    and the drain then completes. (The gateway is one SQLite replica: drained with the
    owner, clients would wait for it to restart; so the owner is first put on a node
    without the gateway.)"""
    gateway_node = items(
        running, "pods", "-l", "app.kubernetes.io/component=gateway", namespace=NAMESPACE
    )[0]["spec"]["nodeName"]
    if owner_pod(running, SESSION)["node"] == gateway_node:
        migrate(running, "off-the-gateways-node", other_node(running, gateway_node))
        wait_condition(running, "agentmigration/off-the-gateways-node", "Succeeded", 300)
    before = owner_pod(running, SESSION)
    assert before["node"] != gateway_node

    def drain() -> None:
        running.kubectl(
            "drain",
            before["node"],
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=300s",
            timeout=360,
        )

    try:
        with port_forward(running, GATEWAY, 8800) as url:
            load = asyncio.run(under_load(url, SESSION, drain))
    finally:
        running.kubectl("uncordon", before["node"], check=False)
    assert_invariants(load.verdict())
    after = owner_pod(running, SESSION)
    assert after["node"] != before["node"]
    assert after["name"] != before["name"]
    # The owner's node is empty of agent pods: the drain evicted nothing still serving.
    drained = items(running, "pods", f"--field-selector=spec.nodeName={before['node']}")
    assert not drained, [p["metadata"]["name"] for p in drained]


def test_deleting_a_running_migration_rolls_it_back(running: Cluster) -> None:
    before = owner_pod(running, SESSION)
    epoch = session_status(running)["epoch"]
    migrate(running, "cancelled", other_node(running, before["node"]))
    eventually(
        "the migration under way", lambda: phase_of(running, "cancelled") in IN_FLIGHT, 120, 0.1
    )
    running.kubectl(
        "delete", "agentmigration", "cancelled", "-n", SESSIONS, "--timeout=120s", timeout=150
    )
    # The session stays where it was, at its epoch; the shadow is gone.
    assert owner_pod(running, SESSION)["uid"] == before["uid"]
    status = session_status(running)
    assert status["epoch"] == epoch, status
    eventually(
        "no shadow pod left",
        lambda: (
            not items(
                running, "pods", "-l", f"shadowpod.dev/session={SESSION},shadowpod.dev/role=shadow"
            )
        ),
        60,
    )
    wait_condition(running, f"agentsession/{SESSION}", "Ready", 60)


def test_killing_the_operator_mid_migration_resumes_it(running: Cluster) -> None:
    before = owner_pod(running, SESSION)
    migrate(running, "resumed", other_node(running, before["node"]))
    eventually(
        "the migration under way", lambda: phase_of(running, "resumed") in IN_FLIGHT, 120, 0.1
    )
    operator = items(
        running, "pods", "-l", "app.kubernetes.io/component=operator", namespace=NAMESPACE
    )
    running.kubectl(
        "delete",
        "pod",
        "-n",
        NAMESPACE,
        operator[0]["metadata"]["name"],
        "--grace-period=0",
        "--force",
        "--wait=false",
    )
    wait_condition(running, "agentmigration/resumed", "Succeeded", 300)
    after = owner_pod(running, SESSION)
    assert after["node"] != before["node"]
    running.kubectl(
        "rollout", "status", "-n", NAMESPACE, f"deployment/{OPERATOR}", "--timeout=120s"
    )


def test_deleting_the_owner_pod_gives_a_new_owner_at_a_new_epoch(running: Cluster) -> None:
    before = owner_pod(running, SESSION)
    epoch = session_status(running)["epoch"]
    running.kubectl("delete", "pod", before["name"], "-n", SESSIONS, "--wait=false")

    def replaced() -> bool:
        status = session_status(running)
        return status.get("epoch", 0) > epoch and status.get("ownerPod") != before["name"]

    eventually("a new owner at a new epoch", replaced, 180)
    wait_condition(running, f"agentsession/{SESSION}", "Ready", 120)
    assert owner_pod(running, SESSION)["name"] != before["name"]


def test_deleting_the_session_leaves_nothing_it_owned(running: Cluster) -> None:
    uid = get(running, "agentsession", SESSION)["metadata"]["uid"]
    running.kubectl(
        "delete", "agentsession", SESSION, "-n", SESSIONS, "--timeout=120s", timeout=150
    )

    def owned() -> list[str]:
        left = []
        for kind in ("pods", "secrets", "poddisruptionbudgets", "agentmigrations", "services"):
            for body in items(running, kind):
                refs = body["metadata"].get("ownerReferences") or []
                labelled = (body["metadata"].get("labels") or {}).get("shadowpod.dev/session")
                if labelled == SESSION or any(ref["uid"] == uid for ref in refs):
                    left.append(f"{kind}/{body['metadata']['name']}")
        return left

    deadline = time.monotonic() + 120
    while owned() and time.monotonic() < deadline:
        time.sleep(1)
    assert owned() == []
