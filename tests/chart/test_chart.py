"""The chart as real Helm renders and installs it: every switch off (the defaults) and on,
the journal backends, RBAC scopes, and values Helm must refuse with a message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from shadowpod.kube import names
from shadowpod.kube.models.v1alpha1 import AgentSession
from tests.chart.helm import CHART, NAMESPACE, RELEASE, Helm, HelmFailed, Rendered

OPERATOR = f"{RELEASE}-shadowpod-operator"
GATEWAY = f"{RELEASE}-shadowpod-gateway"
GATEWAY_URL = f"http://{GATEWAY}.{NAMESPACE}.svc:8800"


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def rules_of(rendered: Rendered, kind: str, name: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = rendered.one(kind, name)["rules"]
    return rules


def grants(rules: list[dict[str, Any]], resource: str) -> set[str]:
    return {verb for rule in rules if resource in rule["resources"] for verb in rule["verbs"]}


def test_defaults_install_the_operator_gateway_and_crds_and_nothing_optional(
    defaults: Rendered,
) -> None:
    rendered = defaults
    assert rendered.kinds() == sorted(
        ["ServiceAccount"] * 2
        + ["Secret", "PersistentVolumeClaim"]
        + ["CustomResourceDefinition"] * 3
        + ["ClusterRole"] * 2
        + ["ClusterRoleBinding"] * 2
        + ["Service"] * 2
        + ["Deployment"] * 2
    )
    for absent in ("ServiceMonitor", "PrometheusRule", "NetworkPolicy", "PodDisruptionBudget"):
        assert rendered.all(absent) == []
    assert rendered.all("ConfigMap") == []


def test_the_operator_runs_alone_standalone_with_kopfs_liveness_probe(
    defaults: Rendered,
) -> None:
    rendered = defaults
    deployment = rendered.one("Deployment", OPERATOR)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = rendered.container(OPERATOR)
    assert container["image"] == "shadowpod:0.1.0"
    args = container["args"]
    assert args[:4] == ["operator", "--standalone", "--liveness", "http://0.0.0.0:8080/healthz"]
    assert "--all-namespaces" in args and "--namespace" not in args
    assert "--no-criu" in args and "--criu" not in args
    assert "--checkpoint-registry" not in args
    assert args[args.index("--metrics-port") + 1] == "9090"
    assert args[args.index("--metrics-host") + 1] == "0.0.0.0"
    assert args[args.index("--log-format") + 1] == "json"
    assert env(container) == {
        "SHADOWPOD_GATEWAY_URL": GATEWAY_URL,
        "SHADOWPOD_AGENT_GATEWAY_URL": GATEWAY_URL,
        "SHADOWPOD_CONTROL_TOKEN_FILE": "/var/run/shadowpod/control/token",
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # Kopf answers /healthz once its startup handlers have run: `rollout status` (NOTES'
    # first step) waits for an operator that serves, not one that is still starting.
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    service = rendered.one("Service", f"{OPERATOR}-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


async def test_operator_flags_follow_values(helm: Helm) -> None:
    rendered = await helm.install(
        {
            "operator": {
                "watchNamespaces": ["team-a", "team-b"],
                "criu": True,
                "checkpointRegistry": "registry.internal:5000/checkpoints",
                "metricsPort": 0,
                "logFormat": "text",
                "logLevel": "debug",
                "agentGatewayUrl": "http://gateway.example:8800",
            },
            "image": {"repository": "registry.example/shadowpod", "tag": "1.2.3"},
        }
    )
    container = rendered.container(OPERATOR)
    args = container["args"]
    assert "--all-namespaces" not in args
    namespaces = [args[i + 1] for i, arg in enumerate(args) if arg == "--namespace"]
    assert namespaces == ["team-a", "team-b"]
    assert "--criu" in args and "--no-criu" not in args
    registry = args[args.index("--checkpoint-registry") + 1]
    assert registry == "registry.internal:5000/checkpoints"
    assert args[args.index("--metrics-port") + 1] == "0"
    assert args[args.index("--log-format") + 1] == "text"
    assert args[args.index("--log-level") + 1] == "debug"
    assert env(container)["SHADOWPOD_AGENT_GATEWAY_URL"] == "http://gateway.example:8800"
    assert env(container)["SHADOWPOD_GATEWAY_URL"] == GATEWAY_URL
    assert container["image"] == "registry.example/shadowpod:1.2.3"
    # No metrics endpoint: no port, no Service for it.
    assert [port["name"] for port in container["ports"]] == ["health"]
    assert rendered.names().count(f"Service/{OPERATOR}-metrics") == 0


def test_sqlite_gateway_is_one_replica_on_a_kept_claim(defaults: Rendered) -> None:
    rendered = defaults
    deployment = rendered.one("Deployment", GATEWAY)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = rendered.container(GATEWAY)
    args = container["args"]
    assert args[:5] == ["gateway", "--host", "0.0.0.0", "--port", "8800"]
    assert env(container) == {
        "SHADOWPOD_JOURNAL": "sqlite:///var/lib/shadowpod/journal.db",
        "SHADOWPOD_CONTROL_TOKEN_FILE": "/var/run/shadowpod/control/token",
    }
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts["journal"] == "/var/lib/shadowpod"
    claim = rendered.one("PersistentVolumeClaim", f"{GATEWAY}-journal")
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = rendered.one("Service", GATEWAY)
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8800, "targetPort": "http", "protocol": "TCP"}
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_the_gateway_memory_limit_holds_a_read_of_the_largest_snapshot(
    defaults: Rendered,
) -> None:
    """A snapshot PUT streams (a few hundred KiB, whatever its size), but a read of one
    holds it: the compressed row, the document and the answer built around it. The
    memory limit must leave room for that above the gateway's working set, or the
    largest snapshot the gateway accepts is one it cannot serve to a restore."""
    container = defaults.container(GATEWAY)
    args = container["args"]
    max_snapshot = int(args[args.index("--max-snapshot-bytes") + 1])
    limit = _bytes(container["resources"]["limits"]["memory"])
    assert limit >= 256 * 2**20 + 3 * max_snapshot


def _bytes(quantity: str) -> int:
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30)):
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity)


async def test_postgresql_gateway_scales_and_reads_the_dsn_from_a_secret(helm: Helm) -> None:
    rendered = await helm.install(
        {
            "gateway": {
                "replicas": 3,
                "journal": {"backend": "postgresql", "postgresql": {"existingSecret": "pg"}},
                "clientTokens": {"existingSecret": "clients"},
            }
        }
    )
    deployment = rendered.one("Deployment", GATEWAY)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert rendered.all("PersistentVolumeClaim") == []
    container = rendered.container(GATEWAY)
    assert env(container)["SHADOWPOD_JOURNAL"] == {"secretKeyRef": {"name": "pg", "key": "dsn"}}
    assert env(container)["SHADOWPOD_CLIENT_TOKEN_FILE"] == "/var/run/shadowpod/clients/tokens"
    assert "journal" not in {mount["name"] for mount in container["volumeMounts"]}
    assert "replicas share the PostgreSQL journal" in rendered.notes
    assert rendered.all("PodDisruptionBudget") == []  # not asked for
    # Sessions are placed by lease: each replica says where the others reach it.
    assert env(container)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env(container)["SHADOWPOD_ADVERTISE_URL"] == "http://$(POD_IP):8800"
    assert env(container)["SHADOWPOD_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    args = container["args"]
    assert args[args.index("--lease-ttl") + 1] == "10"
    names = list(env(container))
    assert names.index("POD_IP") < names.index("SHADOWPOD_ADVERTISE_URL")  # $(POD_IP) expands


async def test_a_budget_keeps_all_but_one_of_several_gateway_replicas(helm: Helm) -> None:
    rendered = await helm.install(
        {
            "gateway": {
                "replicas": 3,
                "journal": {"backend": "postgresql", "postgresql": {"existingSecret": "pg"}},
            },
            "podDisruptionBudget": {"enabled": True},
        }
    )
    budget = rendered.one("PodDisruptionBudget", GATEWAY)
    assert budget["spec"]["maxUnavailable"] == 1
    gateway_pod_labels = rendered.one("Deployment", GATEWAY)["spec"]["template"]["metadata"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= gateway_pod_labels["labels"].items()
    assert "PodDisruptionBudget" not in rendered.notes


def test_every_pod_and_container_is_locked_down(everything_on: Rendered) -> None:
    rendered = everything_on
    specs = list(rendered.pod_specs())
    assert len(specs) == 2
    for spec in specs:
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 65532
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["runAsNonRoot"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
            assert container["resources"]["limits"]["memory"]


def test_everything_on_adds_monitoring_policies_and_budget(everything_on: Rendered) -> None:
    rendered = everything_on
    monitors = {obj["metadata"]["name"]: obj for obj in rendered.all("ServiceMonitor")}
    assert set(monitors) == {f"{RELEASE}-shadowpod-operator", f"{RELEASE}-shadowpod-gateway"}
    operator_endpoint = monitors[f"{RELEASE}-shadowpod-operator"]["spec"]["endpoints"][0]
    gateway_endpoint = monitors[f"{RELEASE}-shadowpod-gateway"]["spec"]["endpoints"][0]
    assert (operator_endpoint["port"], operator_endpoint["path"]) == ("metrics", "/metrics")
    assert (gateway_endpoint["port"], gateway_endpoint["path"]) == ("http", "/metrics")
    # Each ServiceMonitor selects exactly the Service whose port it names.
    services = {obj["metadata"]["name"]: obj for obj in rendered.all("Service")}
    for monitor in monitors.values():
        selector = monitor["spec"]["selector"]["matchLabels"]
        port = monitor["spec"]["endpoints"][0]["port"]
        matched = [
            name
            for name, service in services.items()
            if selector.items() <= service["metadata"]["labels"].items()
        ]
        assert len(matched) == 1
        assert port in {p["name"] for p in services[matched[0]]["spec"]["ports"]}

    alerts = [
        rule["alert"]
        for group in rendered.one("PrometheusRule", f"{RELEASE}-shadowpod")["spec"]["groups"]
        for rule in group["rules"]
    ]
    assert alerts == [
        "ShadowpodFencePauseHigh",
        "ShadowpodMigrationSlow",
        "ShadowpodMigrationStuck",
        "ShadowpodMigrationRollbackRateHigh",
        "ShadowpodUpgradeGateUnavailable",
        "ShadowpodRolloutHalted",
        "ShadowpodRolloutStalled",
        "ShadowpodSessionWithoutReadyOwner",
        "ShadowpodJournalNamespaceLarge",
        "ShadowpodOperatorAbsent",
    ]

    # One gateway replica (SQLite): a budget would protect nothing (maxUnavailable 1) or
    # block every drain; none is made, and NOTES say why.
    assert rendered.all("PodDisruptionBudget") == []
    assert "no PodDisruptionBudget for one gateway replica" in rendered.notes

    dashboard = rendered.one("ConfigMap", f"{RELEASE}-shadowpod-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "shadowpod.json").read_text())
    assert json.loads(dashboard["data"]["shadowpod.json"]) == shipped


async def test_network_policies_let_agents_reach_only_the_gateway(helm: Helm) -> None:
    rendered = await helm.install(
        {
            "networkPolicy": {
                "enabled": True,
                "agentNamespaces": ["team-a"],
                "gatewayFrom": [{"namespaceSelector": {"matchLabels": {"clients": "yes"}}}],
                "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            }
        }
    )
    policies = {
        (obj["metadata"].get("namespace"), obj["metadata"]["name"]): obj["spec"]
        for obj in rendered.all("NetworkPolicy")
    }
    assert set(policies) == {
        (NAMESPACE, GATEWAY),
        (NAMESPACE, OPERATOR),
        ("team-a", f"{RELEASE}-shadowpod-agents"),
    }
    operator_pod = {
        "app.kubernetes.io/name": "shadowpod",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "operator",
    }
    agent_pod = {
        "app.kubernetes.io/name": "shadowpod-agent",
        "app.kubernetes.io/managed-by": "shadowpod-operator",
    }
    gateway = policies[(NAMESPACE, GATEWAY)]
    (rule,) = gateway["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": operator_pod}},
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}},
            "podSelector": {"matchLabels": agent_pod},
        },
        {"namespaceSelector": {"matchLabels": {"clients": "yes"}}},
    ]
    operator = policies[(NAMESPACE, OPERATOR)]
    assert operator["ingress"] == [
        {
            "ports": [{"port": "metrics", "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        }
    ]
    agents = policies[("team-a", f"{RELEASE}-shadowpod-agents")]
    assert agents["podSelector"] == {"matchLabels": agent_pod}
    assert agents["policyTypes"] == ["Ingress", "Egress"]
    to_gateway, to_dns = agents["egress"]
    assert to_gateway["ports"] == [{"port": 8800, "protocol": "TCP"}]
    assert to_gateway["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "gateway"
    )
    assert {port["port"] for port in to_dns["ports"]} == {53}
    assert agents["ingress"][0]["from"][0]["podSelector"] == {"matchLabels": operator_pod}
    # The labels the policies select agents by are the ones the operator gives them.
    assert agent_pod == {
        names.NAME_LABEL: names.AGENT_APP,
        names.MANAGED_BY_LABEL: names.MANAGED_BY,
    }


async def test_gateway_replicas_may_reach_each_other_through_the_network_policy(
    helm: Helm,
) -> None:
    """They forward a session's requests to the replica that serves it."""
    rendered = await helm.install(
        {
            "gateway": {
                "replicas": 3,
                "journal": {"backend": "postgresql", "postgresql": {"existingSecret": "pg"}},
            },
            "networkPolicy": {"enabled": True},
        }
    )
    (rule,) = rendered.one("NetworkPolicy", GATEWAY)["spec"]["ingress"]
    gateway_pods = rendered.one("Deployment", GATEWAY)["spec"]["selector"]["matchLabels"]
    assert {"podSelector": {"matchLabels": gateway_pods}} in rule["from"]


def test_rbac_cluster_wide_by_default_without_node_proxy(defaults: Rendered) -> None:
    rendered = defaults
    cluster = rules_of(rendered, "ClusterRole", f"{OPERATOR}-cluster")
    sessions = rules_of(rendered, "ClusterRole", f"{OPERATOR}-sessions")
    assert grants(cluster, "nodes") == {"get", "list", "watch"}
    assert grants(cluster, "nodes/proxy") == set()
    assert grants(cluster, "customresourcedefinitions") == {"get", "list", "watch"}
    # Watched: the operator's handler of agent pods' events (a real API server refuses
    # the watch without it, and the operator stops).
    assert grants(sessions, "pods") == {"get", "list", "watch", "create", "patch", "delete"}
    # Each agent pod's owner credential is patched into the session's Secret.
    assert grants(sessions, "secrets") == {"get", "create", "patch"}
    # Golden sessions read, the answers an upgrade gate compared written.
    assert grants(sessions, "configmaps") == {"get", "create", "patch"}
    assert grants(sessions, "agentsessions") == {"get", "list", "watch", "patch"}
    assert grants(sessions, "agentmigrations") == {
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "delete",
    }
    assert grants(sessions, "agentsessions/status") == {"get", "patch"}
    assert grants(sessions, "poddisruptionbudgets") == {"get", "create", "delete"}
    assert grants(sessions, "events") == {"create"}
    for rule in cluster + sessions:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
    # The gateway's ServiceAccount is bound to nothing.
    subjects = [
        subject["name"]
        for binding in rendered.all("ClusterRoleBinding") + rendered.all("RoleBinding")
        for subject in binding["subjects"]
    ]
    assert set(subjects) == {OPERATOR}


async def test_rbac_with_criu_grants_node_proxy_create_only(helm: Helm) -> None:
    rendered = await helm.install({"operator": {"criu": True}})
    cluster = rules_of(rendered, "ClusterRole", f"{OPERATOR}-cluster")
    assert grants(cluster, "nodes/proxy") == {"create"}
    sessions = rules_of(rendered, "ClusterRole", f"{OPERATOR}-sessions")
    assert grants(sessions, "podcheckpoints") == {"create", "get", "delete", "restore"}
    [rule] = [r for r in sessions if "podcheckpoints" in r["resources"]]
    assert "node.k8s.io" in rule["apiGroups"]


def test_rbac_without_criu_grants_no_pod_checkpoints(defaults: Rendered) -> None:
    sessions = rules_of(defaults, "ClusterRole", f"{OPERATOR}-sessions")
    assert grants(sessions, "podcheckpoints") == set()


async def test_the_operator_deletes_checkpoint_images_with_the_registry_secret(
    helm: Helm,
) -> None:
    rendered = await helm.install(
        {
            "operator": {
                "criu": True,
                "checkpointRegistry": "registry.internal:5000/checkpoints",
                "checkpointRegistryInsecure": True,
                "checkpointRegistryAuthSecret": "registry-delete",
            }
        }
    )
    container = rendered.container(OPERATOR)
    args = container["args"]
    authfile = args[args.index("--checkpoint-registry-authfile") + 1]
    assert "--checkpoint-registry-insecure" in args
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "registry-auth"]
    assert authfile == f"{mount['mountPath']}/.dockerconfigjson" and mount["readOnly"]
    volumes = rendered.one("Deployment", OPERATOR)["spec"]["template"]["spec"]["volumes"]
    [volume] = [v for v in volumes if v["name"] == "registry-auth"]
    assert volume["secret"]["secretName"] == "registry-delete"


async def test_rbac_with_watched_namespaces_is_roles_in_those_namespaces(helm: Helm) -> None:
    rendered = await helm.install({"operator": {"watchNamespaces": ["team-a", "team-b"]}})
    roles = {
        (obj["metadata"]["namespace"], obj["metadata"]["name"]) for obj in rendered.all("Role")
    }
    assert roles == {("team-a", f"{OPERATOR}-sessions"), ("team-b", f"{OPERATOR}-sessions")}
    bindings = rendered.all("RoleBinding")
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
        ]
    # Nothing namespaced is granted cluster-wide.
    cluster_roles = rendered.all("ClusterRole")
    assert [role["metadata"]["name"] for role in cluster_roles] == [f"{OPERATOR}-cluster"]
    assert grants(cluster_roles[0]["rules"], "pods") == set()
    assert grants(cluster_roles[0]["rules"], "secrets") == set()


async def test_the_control_token_is_kept_across_upgrades(helm: Helm) -> None:
    first = await helm.install()
    token = first.one("Secret", f"{RELEASE}-shadowpod-control-token")["data"]["token"]
    second = await helm.upgrade({"gateway": {"logLevel": "debug"}})
    assert second.one("Secret", f"{RELEASE}-shadowpod-control-token")["data"]["token"] == token
    # Another release gets a token of its own (the CRDs are the first release's).
    other = await helm.install({"crds": {"enabled": False}}, release="other")
    assert other.one("Secret", "other-shadowpod-control-token")["data"]["token"] != token


async def test_an_existing_control_token_secret_is_used_not_made(helm: Helm) -> None:
    rendered = await helm.install({"gateway": {"controlToken": {"existingSecret": "mine"}}})
    assert rendered.all("Secret") == []
    for deployment in (OPERATOR, GATEWAY):
        volumes = rendered.one("Deployment", deployment)["spec"]["template"]["spec"]["volumes"]
        secrets = [volume["secret"]["secretName"] for volume in volumes if "secret" in volume]
        assert secrets == ["mine"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"gateway": {"replicas": 2}},
            "gateway.replicas is 2 but the SQLite journal is one file on one volume",
        ),
        (
            {"gateway": {"journal": {"backend": "postgresql"}}},
            "gateway.journal.postgresql.existingSecret is empty",
        ),
        ({"gateway": {"journal": {"backend": "mysql"}}}, "backend"),
        ({"gateway": {"replicas": 0}}, "replicas"),
        ({"operator": {"criu": "yes"}}, "criu"),
        ({"nodeAgent": {"enabled": True}}, "nodeAgent.enabled needs operator.checkpointRegistry"),
        ({"nodeAgent": {"checkpointsDir": "var/lib"}}, "checkpointsDir"),
        ({"operator": {"watchNamespaces": ["Team_A"]}}, "watchNamespaces"),
        ({"operator": {"agentGatewayUrl": "gateway:8800"}}, "agentGatewayUrl"),
        ({"metrics": {"prometheusRule": {"rollbackRatio": 2}}}, "rollbackRatio"),
        # A threshold on a histogram must be one of its bucket bounds.
        ({"metrics": {"prometheusRule": {"fencePauseSeconds": 0.3}}}, "fencePauseSeconds"),
        ({"metrics": {"prometheusRule": {"migrationSlowRatio": 0.6}}}, "migrationSlowRatio"),
        ({"metrics": {"prometheusRule": {"ownerlessFor": "five minutes"}}}, "ownerlessFor"),
        ({"gatway": {"replicas": 2}}, "gatway"),
        (
            {"operator": {"serviceAccount": {"create": False}}},
            "operator.serviceAccount.name: name an existing ServiceAccount",
        ),
    ],
)
async def test_bad_values_fail_the_install_with_a_message(
    helm: Helm, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmFailed, match=message):
        await helm.install(values)


async def test_notes_say_what_to_do_next(helm: Helm) -> None:
    rendered = await helm.install({"operator": {"watchNamespaces": ["team-a"]}})
    assert f"rollout status deploy/{OPERATOR} deploy/{GATEWAY}" in rendered.notes
    assert "in one of team-a" in rendered.notes
    # The command it gives applies a valid AgentSession in a watched namespace.
    command = rendered.notes[rendered.notes.index("echo '") : rendered.notes.index("-f -")]
    document = json.loads(command[len("echo '") : command.index("' ")])
    assert AgentSession.model_validate(document).spec.image == "shadowpod-refagent:v1"
    assert "kubectl apply -n team-a" in command
    assert f"port-forward svc/{GATEWAY} 8800" in rendered.notes
    assert "docs/runbooks.md" in rendered.notes


async def test_helm_lint_finds_nothing_to_warn_about(helm: Helm, tmp_path: Path) -> None:
    assert await helm.lint() == []
    # The same lint sees a broken template.
    broken = tmp_path / "shadowpod"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "pdb.yaml").write_text("{{ if }}\n")
    messages = await helm.lint(broken)
    assert [message["path"] for message in messages] == ["templates/"]
    assert messages[0]["severity"] == 3  # an error


async def test_the_node_agent_is_off_by_default_and_root_only_on_checkpoint_nodes(
    helm: Helm, defaults: Rendered
) -> None:
    agent = f"{RELEASE}-shadowpod-node-agent"
    assert not [n for n in defaults.names() if n.startswith("DaemonSet/")]
    rendered = await helm.install(
        {
            "operator": {"criu": True, "checkpointRegistry": "registry.internal/ckpt"},
            "nodeAgent": {"enabled": True, "registryAuthSecret": "push", "tlsVerify": False},
        }
    )
    daemonset = rendered.one("DaemonSet", agent)
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"shadowpod.dev/checkpoint-restore": "true"}
    assert pod["automountServiceAccountToken"] is False  # it needs no API access
    [container] = pod["containers"]
    args = container["args"]
    assert args[0] == "node-agent"
    assert args[args.index("--registry") + 1] == "registry.internal/ckpt"
    assert "--no-tls-verify" in args
    assert args[args.index("--authfile") + 1] == "/var/run/shadowpod/registry/auth.json"
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["hostPath"]["path"] == "/var/lib/kubelet/checkpoints"
    assert volumes["registry-auth"]["secret"]["defaultMode"] == 0o400


def _readme_rbac_table() -> dict[str, dict[str, set[str]]]:
    """The chart README's RBAC rows for the operator: where → resource → verbs
    ("pods: get list create patch delete; secrets: get create; …")."""
    text = (CHART / "README.md").read_text().split("## RBAC", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, dict[str, set[str]]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] != "operator":
            continue
        granted = rows.setdefault(cells[2], {})
        for item in cells[1].split(";"):
            resource, _, verbs = item.partition(":")
            resource = resource.split("(")[0].strip()
            granted[resource] = set(verbs.split("(")[0].split())
    return rows


def test_the_readmes_rbac_table_is_what_the_chart_grants(defaults: Rendered) -> None:
    """Every namespaced resource the operator is granted is in the README's table with
    its verbs (a user deciding whether to install reads the table, not the template)."""
    [row] = [
        row for where, row in _readme_rbac_table().items() if where.startswith("a ClusterRole")
    ]
    granted: dict[str, set[str]] = {}
    for rule in rules_of(defaults, "ClusterRole", f"{OPERATOR}-sessions"):
        for resource in rule["resources"]:
            name = "their status" if resource.endswith("/status") else resource
            granted.setdefault(name, set()).update(rule["verbs"])
    assert row == granted
