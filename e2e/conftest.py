"""The end-to-end suite (`make cluster-test`): the README's Kubernetes steps run as
written on a real cluster — by default `make cluster`'s, on this machine — then live
migrations, drains and failures under client load. Nothing here skips: a cluster that
cannot be had fails the suite, saying why.

``E2E_CLUSTER=kind`` runs on a kind cluster instead (made here, where kind's node image
can be had); ``E2E_KEEP=1`` leaves it.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from e2e.cluster import (
    Cluster,
    delete_kind_cluster,
    kind_cluster,
    local_cluster,
    missing_kind_tools,
)
from e2e.readme import ON_KUBERNETES, WITH_HELM, run_block, shell_blocks
from e2e.support import SESSIONS

# The README's session (in the kubeconfig's default namespace).
README_SESSION = "support-ada"


@pytest.fixture(scope="session")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    """The README's "On Kubernetes" block then its "With Helm" block, in one shell as a
    reader would type them: the images, the cluster, the chart installed with real Helm,
    the example session, its live image bump and an on-demand move. Yields the cluster
    and what the blocks printed."""
    if os.environ.get("E2E_CLUSTER") == "kind":
        reason = missing_kind_tools()
        if reason:
            pytest.fail(reason)
        cluster = kind_cluster(tmp_path_factory.mktemp("kind"))
        script = "\n".join(shell_blocks(WITH_HELM))
        env = cluster.env()
    else:
        script = "\n".join(shell_blocks(ON_KUBERNETES) + shell_blocks(WITH_HELM))
        env = {}
        cluster = local_cluster()
    result = run_block(script, env)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        dump = cluster.dump() if cluster.kubeconfig.exists() else "(no cluster)"
        pytest.fail(
            f"the README's Kubernetes blocks exited {result.returncode}:\n{output}\n{dump}",
            pytrace=False,
        )
    yield cluster, output
    if os.environ.get("E2E_CLUSTER") == "kind":
        delete_kind_cluster()


@pytest.fixture(scope="session")
def cluster(readme_run: tuple[Cluster, str]) -> Cluster:
    """The cluster with the chart installed (by the README's own `helm install`) and the
    namespace the suite's sessions run in."""
    found = readme_run[0]
    found.kubectl("create", "namespace", SESSIONS, check=False)
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the cluster's state: objects, describes, logs."""
    report = yield
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    found = next((value for value in funcargs.values() if isinstance(value, Cluster)), None)
    if report.failed and found is not None:
        report.sections.append(("cluster", found.dump()))
    return report
