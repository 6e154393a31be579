"""The CRIU path, for real: an agent under client load checkpointed while it serves,
restored as the shadow at another address, caught up, fenced and promoted.

CRIU 4 runs in a container of the CRIU image (``hack/image-criu``: Debian trixie's
criu 4.1; bookworm's 3.17 fails on current kernels) with the rights it needs; the
worktree's code runs in it, mounted. The scenario is ``tests/image/criu_scenario.py``;
this test judges its report. Like every image test it runs with ``make image-test``
(``SHADOWPOD_IMAGE_TESTS=1``); it skips, saying why, where no CRIU image can be made
or CRIU cannot run on the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any, Final

import pytest

from tests.image.docker import LABEL, REPO, DockerError, docker

# What CRIU needs of a container (docs/criu.md).
CRIU_RIGHTS: Final = (
    "--cap-add=ALL",
    "--cap-drop=SYS_RESOURCE",
    "--security-opt=seccomp=unconfined",
    "--security-opt=systempaths=unconfined",
    "--network=host",
)
BUILD_TIMEOUT_S: Final = 1800
SCENARIO_TIMEOUT_S: Final = 300


@pytest.fixture(scope="module")
def criu_image() -> str:
    """The CRIU image (made once: minutes from cold), checked by ``criu check``."""
    made = subprocess.run(
        [str(REPO / "hack" / "image-criu")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if made.returncode != 0:
        errors = [line for line in made.stderr.splitlines() if line.startswith("error")]
        pytest.skip(f"no CRIU image here: {errors[-1] if errors else made.stderr[-300:]}")
    image = made.stdout.strip().splitlines()[-1]
    check = subprocess.run(
        ["docker", "run", "--rm", *CRIU_RIGHTS, image, "criu", "check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check.returncode != 0:
        pytest.skip(f"CRIU cannot run on this kernel (`criu check`): {check.stdout[-300:]}")
    return image


async def run_scenario(image: str, out: Path) -> tuple[int, str, dict[str, Any] | None]:
    name = f"shadowpod-criu-test-{uuid.uuid4().hex[:10]}"
    try:
        output = await docker(
            "run",
            f"--name={name}",
            f"--label={LABEL}={os.getpid()}",
            *CRIU_RIGHTS,
            f"--volume={REPO}:/src:ro",
            f"--volume={out}:/out:rw",
            "--workdir=/src",
            "--env=PYTHONPATH=/src/operator:/src",
            "--env=PYTHONDONTWRITEBYTECODE=1",
            image,
            "/opt/shadowpod/bin/python",
            "-m",
            "tests.image.criu_scenario",
            "/out/report.json",
            check=False,
            timeout_s=SCENARIO_TIMEOUT_S,
        )
        code = int((await docker("inspect", "--format={{.State.ExitCode}}", name)).strip())
        logs = await docker("logs", name, check=False)
    finally:
        await docker("rm", "--force", name, check=False)
    return code, output + logs, _report(out / "report.json")


def _report(path: Path) -> dict[str, Any] | None:
    try:
        report: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return report


async def test_criu_migration_under_load_keeps_memory_and_loses_nothing(
    criu_image: str, tmp_path: Path
) -> None:
    try:
        code, logs, report = await run_scenario(criu_image, tmp_path)
    except DockerError as exc:
        pytest.fail(f"the CRIU scenario did not run: {exc}")
    assert report is not None, f"no report (exit {code}):\n{logs[-4000:]}"

    migration = report["migration"]
    assert migration["strategy"] == "criu"
    assert migration["result"] == "Succeeded", migration
    assert report["checkpoint"]["watermark"] > 0
    # Client side: every accepted message answered once, in order.
    verdict = report["verdict"]
    assert verdict["accepted"] > 20
    assert (verdict["lost"], verdict["duplicated"], verdict["reordered"]) == (0, 0, 0), verdict
    failed = [check for check in report["checks"] if not check["ok"]]
    assert failed == [], failed
    assert code == 0, logs[-4000:]

    # A side effect just before the checkpoint and one after the move: each ran once.
    assert report["charges_run"] == ["5", "7"]
    assert report["charge_entries"] == {"tool_call": 2, "tool_result": 2}

    # The warm cache, never journaled, went along with the process: same id, same
    # contents, now answered by the restored instance at the new address...
    before, after = report["warm_before"], report["warm_after"]
    assert before["instance"] == report["source"]
    assert after["instance"] == report["target"] != report["source"]
    assert (after["id"], after["cached"]) == (before["id"], "Oslo")
    # ... which the app-level state path cannot carry: a new process, a cold cache.
    assert report["state_path"]["result"] == "Succeeded"
    cold = report["warm_after_state_path"]
    assert cold["instance"] == report["state_path"]["target_instance"]
    assert (cold["id"] != before["id"], cold["cached"]) == (True, "nothing")
    # The checkpoint (every memory page of the agent) is gone once restored.
    assert report["checkpoints_left"] == []
