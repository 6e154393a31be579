"""The operator's and the gateway's `/metrics` as a Prometheus in the cluster would
scrape them after the suite's migrations (this module runs after test_live_migration),
and the chart's alert rules evaluated by promtool on exactly those series."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import Cluster
from e2e.support import GATEWAY, NAMESPACE, OPERATOR_METRICS, items, port_forward

ALERTS = [
    "ShadowpodMigrationSlow",
    "ShadowpodMigrationsFailing",
    "ShadowpodMigrationStuck",
    "ShadowpodFencePauseHigh",
    "ShadowpodUpgradeGateUnavailable",
    "ShadowpodSessionWithoutReadyOwner",
    "ShadowpodOperatorAbsent",
]
# One hour of scrapes, a minute apart.
MINUTES = 60


def scrape(cluster: Cluster, service: str, port: int) -> str:
    with port_forward(cluster, service, port) as url:
        body: bytes = urllib.request.urlopen(f"{url}/metrics", timeout=10).read()
    return body.decode()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    ]


def families(text: str) -> set[str]:
    """Every series name ``/metrics`` declares (a labelled metric with no child yet has
    its HELP and TYPE and no sample): counters' ``_total``, histograms' ``_bucket``,
    ``_sum`` and ``_count`` too."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        names.update(sample.name for sample in family.samples)
    return names


def value(found: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(
        v for n, got, v in found if n == name and all(got.get(k) == w for k, w in labels.items())
    )


@pytest.fixture(scope="module")
def operator_scrape(cluster: Cluster) -> str:
    return scrape(cluster, OPERATOR_METRICS, 9090)


@pytest.fixture(scope="module")
def operator_metrics(operator_scrape: str) -> list[tuple[str, dict[str, str], float]]:
    return samples(operator_scrape)


async def render_rules(values: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The PrometheusRule's spec as real Helm renders it for release ``shadowpod`` in
    NAMESPACE, installed on an emulated API server that serves prometheus-operator's
    kinds (this cluster has no prometheus-operator to take it)."""
    from kubernetes_asyncio import client
    from tests.chart.conftest import emulated_cluster
    from tests.chart.helm import REPO, Helm

    async with emulated_cluster(directory) as (_, connection):
        async with connection.api() as api:
            await client.CoreV1Api(api).create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
            )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.chart.helm_worker",
            str(connection.kubeconfig),
            NAMESPACE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "HELM_DRIVER": "memory"},
            limit=16 * 1024 * 1024,
        )
        helm = Helm(process)
        try:
            rendered = await helm.install(values, release="shadowpod")
        finally:
            await helm.close()
    spec: dict[str, Any] = rendered.all("PrometheusRule")[0]["spec"]
    return spec


@pytest.fixture(scope="module")
def rules(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's alert rules with the installed release's values (the rule switched
    on), for release `shadowpod` in NAMESPACE as the README installs it."""
    import helm_sdkpy  # type: ignore[import-untyped]

    config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=str(cluster.kubeconfig))
    values: dict[str, Any] = asyncio.run(helm_sdkpy.GetValues(config).run("shadowpod")) or {}
    values.setdefault("metrics", {}).setdefault("prometheusRule", {})["enabled"] = True
    directory = tmp_path_factory.mktemp("rules")
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(asyncio.run(render_rules(values, directory))))
    return path


def scrape_labels(cluster: Cluster) -> dict[str, str]:
    """The labels a ServiceMonitor's scrape of the operator's metrics Service gives its
    series: job is the Service's name, then the namespace, the pod and its address."""
    pod = items(cluster, "pods", "-l", "app.kubernetes.io/component=operator", namespace=NAMESPACE)
    return {
        "job": OPERATOR_METRICS,
        "namespace": NAMESPACE,
        "pod": pod[0]["metadata"]["name"],
        "instance": f"{pod[0]['status']['podIP']}:9090",
    }


def promtool_case(
    rules: Path,
    found: list[tuple[str, dict[str, str], float]],
    labels: dict[str, str],
    expected: dict[str, list[dict[str, Any]]],
    up: str = f"1x{MINUTES}",
) -> subprocess.CompletedProcess[str]:
    """An hour in which the operator's counters went from nothing to what was scraped
    (in its first minute) and its gauges held what was scraped; every alert is checked
    at the hour's end."""
    series = []
    for name, own, scraped in found:
        cumulative = name.endswith(("_total", "_bucket", "_sum", "_count"))
        values = f"0 {scraped:g}x{MINUTES - 1}" if cumulative else f"{scraped:g}x{MINUTES}"
        inner = ",".join(f'{k}="{v}"' for k, v in sorted({**own, **labels}.items()))
        series.append({"series": f"{name}{{{inner}}}", "values": values})
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    series.append({"series": f"up{{{inner}}}", "values": up})
    case = {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": f"{MINUTES}m", "alertname": name, "exp_alerts": expected.get(name, [])}
            for name in ALERTS
        ],
    }
    tests = rules.parent / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "tests": [case]}))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: `apt-get install prometheus` (Debian)"
    return subprocess.run(
        [promtool, "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_operators_metrics_show_the_migrations_it_ran(
    operator_metrics: list[tuple[str, dict[str, str], float]],
) -> None:
    # The operator was restarted mid-migration (test_live_migration): it has counted at
    # least the migration it resumed, and none is in flight now.
    assert value(operator_metrics, "shadowpod_migrations_total", result="Succeeded") >= 1
    assert value(operator_metrics, "shadowpod_migration_duration_seconds_count") >= 1
    assert value(operator_metrics, "shadowpod_sessions_without_ready_owner") == 0


def test_the_gateways_metrics_show_the_journal_and_the_fences(cluster: Cluster) -> None:
    found = samples(scrape(cluster, GATEWAY, 8800))
    assert value(found, "shadowpod_journal_appends_total") > 0
    # Every live move of the suite fenced its session once at least.
    assert value(found, "shadowpod_fences_total") >= 3


def test_every_series_the_alerts_read_is_one_shadowpod_exports(
    cluster: Cluster, rules: Path, operator_scrape: str
) -> None:
    """The operator's series, and the gateway's (the journal's size per namespace)."""
    read = {
        name
        for group in yaml.safe_load(rules.read_text())["groups"]
        for rule in group["rules"]
        for name in re.findall(r"\b(shadowpod_\w+)\{", rule["expr"])
    }
    exported = families(operator_scrape) | families(scrape(cluster, GATEWAY, 8800))
    assert read, "no metric found in the rules"
    missing = read - exported
    assert not missing, f"the alerts read series neither operator nor gateway exports: {missing}"


def test_the_alerts_are_quiet_on_this_clusters_series(
    cluster: Cluster, rules: Path, operator_metrics: list[tuple[str, dict[str, str], float]]
) -> None:
    result = promtool_case(rules, operator_metrics, scrape_labels(cluster), {})
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_operator_absent_alert_names_this_releases_operator(
    cluster: Cluster, rules: Path, operator_metrics: list[tuple[str, dict[str, str], float]]
) -> None:
    """Its scrapes failing from minute 10, the operator is reported absent after 5 min,
    under the job the chart's own metrics Service gives its series."""
    labels = scrape_labels(cluster)
    expected = {
        "ShadowpodOperatorAbsent": [
            {
                "exp_labels": {
                    "severity": "critical",
                    "namespace": NAMESPACE,
                    "job": labels["job"],
                },
                "exp_annotations": {
                    "summary": (
                        f"The Shadowpod operator in {NAMESPACE} has not been scraped for 5m."
                    ),
                    "description": (
                        "No AgentSession is reconciled and no migration advances while it is away."
                    ),
                    "runbook_url": (
                        "https://github.com/shadowpod/shadowpod/blob/main/docs/runbooks.md"
                        "#shadowpodoperatorabsent"
                    ),
                },
            }
        ]
    }
    result = promtool_case(rules, operator_metrics, labels, expected, up=f"1x10 0x{MINUTES - 10}")
    assert result.returncode == 0, result.stdout + result.stderr
