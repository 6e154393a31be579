"""`make chart-render` (tests/chart/render.py): the chart as real Helm renders it, values
files in, manifests out, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import HELM_MISSING, REPO

pytestmark = pytest.mark.skipif(HELM_MISSING is not None, reason=HELM_MISSING or "")


def _render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.chart.render", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_values_files_in_manifests_out(tmp_path: Path) -> None:
    first = tmp_path / "a.yaml"
    first.write_text("operator:\n  watchNamespaces: [team-x]\n  logLevel: debug\n")
    second = tmp_path / "b.yaml"
    second.write_text("operator:\n  watchNamespaces: [team-y]\n")  # a later -f wins
    rendered = _render("-f", str(first), "-f", str(second), "--namespace", "ops")
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    names = {(o["kind"], o["metadata"].get("namespace")) for o in objects}
    assert ("Role", "team-y") in names and ("Role", "team-x") not in names
    assert ("Deployment", "ops") in names
    [operator] = [o for o in objects if o["metadata"]["name"] == "shadowpod-operator"
                  and o["kind"] == "Deployment"]  # fmt: skip
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--log-level") + 1] == "debug"
    assert "is installed as" in rendered.stderr  # NOTES, apart from the manifests


def test_values_helm_refuses_are_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gateway:\n  replicas: many\n")
    rendered = _render("-f", str(bad))
    assert rendered.returncode == 1
    assert rendered.stdout == ""
    [line] = rendered.stderr.strip().splitlines()
    assert line.startswith("error: helm refused the values:") and "replicas" in line


def test_a_missing_values_file_exits_2(tmp_path: Path) -> None:
    rendered = _render("-f", str(tmp_path / "none.yaml"))
    assert rendered.returncode == 2
    assert "cannot read the values" in rendered.stderr and "none.yaml" in rendered.stderr
