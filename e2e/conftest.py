"""The end-to-end suite: a kind cluster with the chart installed. Skips, saying why,
where Docker or kind is missing; `e2e/run` runs it (it is not part of `make test`)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Kind, missing_tools

NAMESPACE = "shadowpod-system"
SESSIONS = "e2e"


@pytest.fixture(scope="session")
def kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    cluster = Kind.create(tmp_path_factory.mktemp("kind"))
    cluster.load_images()
    yield cluster
    cluster.delete()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the cluster's state: objects, describes, logs."""
    report = yield
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    cluster = next((value for value in funcargs.values() if isinstance(value, Kind)), None)
    if report.failed and cluster is not None:
        report.sections.append(("cluster", cluster.dump()))
    return report


@pytest.fixture(scope="session")
def installed(kind: Kind) -> Kind:
    """The chart installed with real Helm (helm-sdkpy, as the chart's tests use it)."""
    import asyncio

    import helm_sdkpy  # type: ignore[import-untyped]

    config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=str(kind.kubeconfig))
    asyncio.run(
        helm_sdkpy.Install(config).run(
            "shadowpod",
            str(Path(__file__).resolve().parents[1] / "charts" / "shadowpod"),
            values={
                "image": {"pullPolicy": "Never"},
                "metrics": {"dashboard": {"enabled": True}},
            },
            create_namespace=True,
            wait=True,
            timeout=300,
        )
    )
    kind.kubectl("create", "namespace", SESSIONS, check=False)
    return kind
