"""How `shadowpod bench cluster` reads the API server's request counts: the lines of a
real kube-apiserver's /metrics, summed by group, resource and verb, without the
requests that name no resource (probes, the scrapes themselves)."""

from __future__ import annotations

import pytest

from shadowpod.bench.cluster import percentiles, rates, request_counts


def sample(name: str, value: int, **labels: str) -> str:
    """A line as kube-apiserver v1.37 writes it (every label, in its order)."""
    full = {
        "code": "200",
        "component": "apiserver",
        "dry_run": "",
        "group": "",
        "resource": "",
        "scope": "namespace",
        "subresource": "",
        "verb": "GET",
        "version": "v1",
        **labels,
    }
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in full.items()) + "}" + f" {value}"


TOTAL = "apiserver_request_total"
METRICS = "\n".join(
    [
        f"# HELP {TOTAL} [STABLE] Counter of apiserver requests broken out for each verb.",
        f"# TYPE {TOTAL} counter",
        sample(TOTAL, 10, resource="pods", verb="LIST"),
        sample(TOTAL, 4, resource="pods", subresource="status", verb="PATCH"),
        sample(TOTAL, 1, code="409", resource="pods", verb="LIST"),
        sample(TOTAL, 300, group="shadowpod.dev", resource="agentsessions", version="v1alpha1"),
        sample(TOTAL, 7, component="", scope="", subresource="/metrics", version=""),
        "# HELP apiserver_request_duration_seconds [STABLE] Response latency distribution.",
        "# TYPE apiserver_request_duration_seconds histogram",
        sample("apiserver_request_duration_seconds_count", 11, resource="pods", verb="LIST"),
        "",
    ]
)


def test_request_counts_are_summed_by_group_resource_and_verb() -> None:
    counts = request_counts(METRICS)
    assert counts == {
        ("", "pods", "LIST"): 11.0,  # both codes
        ("", "pods", "PATCH"): 4.0,
        ("shadowpod.dev", "agentsessions", "GET"): 300.0,
    }  # no /metrics scrape, no histogram count


def test_rates_are_per_second_between_two_scrapes_busiest_first() -> None:
    before = {("", "pods", "LIST"): 11.0, ("shadowpod.dev", "agentsessions", "GET"): 300.0}
    after = {
        ("", "pods", "LIST"): 11.0,
        ("shadowpod.dev", "agentsessions", "GET"): 360.0,
        ("", "events", "CREATE"): 6.0,
    }
    assert list(rates(before, after, 60.0).items()) == [
        ("shadowpod.dev/agentsessions GET", 1.0),
        ("core/events CREATE", 0.1),
    ]


def test_percentiles_of_a_hundred_take_the_99th_not_the_maximum() -> None:
    figures = percentiles([float(n) for n in range(1, 101)])
    assert figures == {"p50": 50.5, "p99": 99.0, "max": 100.0, "n": 100}
    assert percentiles([]) == {"p50": None, "p99": None, "max": None, "n": 0}
    assert pytest.approx(percentiles([2.0])["p99"]) == 2.0
