"""The chart as `helm install` left it on a real cluster: the operator and the gateway
run as the chart's ServiceAccounts, bound by its RBAC and nothing more; its
NetworkPolicies and PodDisruptionBudget are in place."""

from __future__ import annotations

from e2e.cluster import Cluster
from e2e.support import GATEWAY, NAMESPACE, OPERATOR, items


def test_the_operator_and_gateway_run_as_the_charts_service_accounts(cluster: Cluster) -> None:
    for app, account in ((OPERATOR, OPERATOR), (GATEWAY, GATEWAY)):
        deployment = items(cluster, "deployments", namespace=NAMESPACE)
        spec = next(d for d in deployment if d["metadata"]["name"] == app)["spec"]
        assert spec["template"]["spec"]["serviceAccountName"] == account
        assert (
            cluster.kubectl(
                "rollout", "status", "-n", NAMESPACE, f"deployment/{app}", "--timeout=60s"
            ).strip()
            != ""
        )


def test_the_operators_rbac_is_what_it_needs_and_no_more(cluster: Cluster) -> None:
    operator = f"system:serviceaccount:{NAMESPACE}:{OPERATOR}"
    gateway = f"system:serviceaccount:{NAMESPACE}:{GATEWAY}"

    def can(who: str, *what: str) -> bool:
        answer = cluster.kubectl("auth", "can-i", "--as", who, *what, check=False).strip()
        return answer == "yes"

    assert can(operator, "create", "pods", "-n", "e2e")
    assert can(operator, "patch", "agentsessions.shadowpod.dev/status", "-n", "e2e")
    assert can(operator, "create", "poddisruptionbudgets.policy", "-n", "e2e")
    assert not can(operator, "delete", "nodes")
    assert not can(operator, "create", "clusterrolebindings")
    assert not can(gateway, "list", "pods", "-n", "e2e")
    assert not can(gateway, "get", "secrets", "-n", "kube-system")


def test_no_request_of_the_operator_was_forbidden(cluster: Cluster) -> None:
    """Every verb the operator used so far was granted: a missing one is a 403 in its log."""
    logs = cluster.kubectl("logs", "-n", NAMESPACE, f"deployment/{OPERATOR}", "--tail=-1")
    forbidden = [line for line in logs.splitlines() if "forbidden" in line.lower()]
    assert not forbidden, "\n".join(forbidden[:10])


def test_the_network_policies_are_in_place_and_one_gateway_has_no_budget(
    cluster: Cluster,
) -> None:
    policies = {
        p["metadata"]["name"] for p in items(cluster, "networkpolicies", namespace=NAMESPACE)
    }
    assert policies, "no NetworkPolicy in the release's namespace"
    # The chart's default is one gateway replica (SQLite): a budget for it would protect
    # nothing (maxUnavailable 1) or block every drain of its node (minAvailable 1), so
    # the chart makes one only for gateway.replicas > 1 (tests/chart checks that case).
    budgets = items(cluster, "poddisruptionbudgets", namespace=NAMESPACE)
    assert budgets == [], budgets
