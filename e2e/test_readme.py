"""The README's "On Kubernetes" and "With Helm" blocks, run word for word on a real
cluster (the ``readme_run`` fixture), did what the README says they do."""

from __future__ import annotations

from e2e.cluster import Cluster
from e2e.conftest import README_SESSION
from e2e.support import get, items


def test_the_example_session_runs_on_v2_after_its_image_bump_and_an_on_demand_move(
    readme_run: tuple[Cluster, str],
) -> None:
    cluster, output = readme_run
    body = get(cluster, "agentsession", README_SESSION, namespace="default")
    status = body["status"]
    assert status["phase"] == "Running", status
    assert status["image"] == "shadowpod-refagent:v2", status
    # Two moves, each a new owner: the image bump, then `kubectl shadowpod migrate`.
    assert status["epoch"] >= 3, status
    # (The drain in test_live_migration may have moved it once more, by NodeDrain.)
    migrations = items(cluster, "agentmigrations", namespace="default")
    results = {m["spec"].get("reason"): m["status"].get("result") for m in migrations}
    assert results.get("ImageChange") == "Succeeded", results
    assert results.get("Manual") == "Succeeded", results
    assert set(results.values()) == {"Succeeded"}, results
    assert "Succeeded; fence pause" in output


def test_the_example_sessions_credential_is_mounted_in_its_owner(
    readme_run: tuple[Cluster, str],
) -> None:
    cluster, _ = readme_run
    owner = get(cluster, "agentsession", README_SESSION, namespace="default")["status"]["ownerPod"]
    pod = get(cluster, "pod", owner, namespace="default")
    assert pod["status"]["phase"] == "Running"
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert any(path.endswith("/credentials/weather-api") for path in mounts), mounts
