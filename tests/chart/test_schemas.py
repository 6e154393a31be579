"""Every object the chart renders, with every switch on and off, against the Kubernetes
API's own schemas (kubernetes-validate: the OpenAPI schemas of each release, offline),
strict: an unknown or misspelt field fails as `kubectl apply --validate=strict` would."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from tests.chart.conftest import render
from tests.chart.helm import Rendered

# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and a current one.
KUBERNETES_VERSIONS = ("1.28.0", "1.33.0")
# prometheus-operator's kinds: no schema ships with Kubernetes. Their content is checked
# by the tests that read them (test_chart, and promtool in test_alerts).
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}

POSTGRESQL_NAMESPACED: dict[str, Any] = {
    "gateway": {
        "replicas": 2,
        "journal": {"backend": "postgresql", "postgresql": {"existingSecret": "pg"}},
        "clientTokens": {"existingSecret": "clients"},
    },
    "operator": {
        "watchNamespaces": ["team-a"],
        "metricsPort": 0,
        "criu": True,
        "checkpointRegistry": "registry.internal/checkpoints",
    },
    "nodeAgent": {"enabled": True, "registryAuthSecret": "checkpoint-push"},
    "networkPolicy": {
        "enabled": True,
        "gatewayFrom": [{"namespaceSelector": {"matchLabels": {"clients": "yes"}}}],
    },
    "crds": {"enabled": False},
}


@pytest.fixture(scope="module")
def postgresql_namespaced(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return asyncio.run(render(POSTGRESQL_NAMESPACED, tmp_path_factory.mktemp("pg")))


@pytest.fixture(params=["defaults", "everything_on", "postgresql_namespaced"])
def rendered(request: pytest.FixtureRequest) -> Rendered:
    shared: Rendered = request.getfixturevalue(request.param)
    return shared


def test_every_rendered_object_is_valid_kubernetes(rendered: Rendered) -> None:
    problems = []
    checked = 0
    for obj in rendered.objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {exc}")
        checked += 1
    assert problems == []
    assert checked == len([obj for obj in rendered.objects if obj["kind"] not in CUSTOM_KINDS]) > 0


def test_the_node_agent_daemonset_is_validated(postgresql_namespaced: Rendered) -> None:
    assert [o for o in postgresql_namespaced.objects if o["kind"] == "DaemonSet"]


def test_the_validator_catches_what_it_should() -> None:
    """The check above would see a misspelt field and a wrong type."""
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i", "securityContxt": {}}]},
            },
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    deployment["spec"]["template"]["spec"]["containers"][0].pop("securityContxt")
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
