"""The release workflow (.github/workflows/release.yml) cannot run here; what it runs
can be checked: the targets, scripts and versions it names exist and agree."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from shadowpod import __version__

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _workflow() -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def _runs(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_it_runs_on_a_version_tag_and_checks_the_tag_is_the_version() -> None:
    workflow = _workflow()
    # YAML 1.1 reads the key `on` as True.
    assert workflow[True]["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+*"]
    chart = yaml.safe_load((ROOT / "charts" / "shadowpod" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    assert "operator/shadowpod/__init__.py" in _runs(workflow["jobs"]["version"])


def test_the_wheel_goes_to_pypi_by_trusted_publishing_after_its_test() -> None:
    jobs = _workflow()["jobs"]
    dist = _runs(jobs["dist"])
    assert "make dist" in dist and "hack/wheel-test dist" in dist
    assert re.search(r"^dist:", (ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    assert os.access(ROOT / "hack" / "wheel-test", os.X_OK)
    pypi = jobs["pypi"]
    assert pypi["needs"] == "dist"
    assert pypi["permissions"]["id-token"] == "write"
    assert any(
        step.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for step in pypi["steps"]
    )
    # No long-lived token: trusted publishing only.
    assert "password" not in str(pypi)


def test_each_image_it_pushes_is_a_target_of_the_dockerfile_with_provenance() -> None:
    images = _workflow()["jobs"]["images"]
    targets = {entry["target"] for entry in images["strategy"]["matrix"]["include"]}
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
    assert targets == {"shadowpod", "refagent-v1", "refagent-v2"} <= stages
    (build,) = [s for s in images["steps"] if s.get("uses", "").startswith("docker/build-push")]
    assert build["with"]["provenance"] == "mode=max"
    assert build["with"]["sbom"] is True


def test_the_chart_is_pushed_as_an_oci_artifact() -> None:
    chart = _runs(_workflow()["jobs"]["chart"])
    assert "helm package charts/shadowpod" in chart
    assert 'helm push chart/shadowpod-*.tgz "oci://' in chart
    # The repository line it rewrites is the one values.yaml has.
    values = (ROOT / "charts" / "shadowpod" / "values.yaml").read_text()
    assert re.search(r"^  repository: shadowpod$", values, flags=re.MULTILINE)
