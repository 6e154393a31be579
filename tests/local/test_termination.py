"""Why an instance stopped reaches whoever runs it — the migration's record — and not
only the instance's log: the agent's termination message (a pod's
``terminationMessagePath``), or its log's last line when it wrote none."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shadowpod.engine.record import InstanceRef, MigrationPolicy, Phase
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.exits import exit_reason
from shadowpod.local.images import ImageMap, examples_dir

REFAGENT = "{examples}/01-reference-agent/refagent.py"


def _images(**extra: dict[str, object]) -> ImageMap:
    return ImageMap.from_data(
        {
            "images": {
                "refagent:v2": {
                    "command": ["{python}", REFAGENT, "--version", "2"],
                    "state_schema": 2,
                    "reads_state_schemas": [1, 2],
                },
                **extra,
            }
        }
    )


async def test_a_target_that_cannot_read_the_state_rolls_back_saying_why(tmp_path: Path) -> None:
    # The image map says v1 reads schema 2; v1's own migration knows better.
    images = _images(
        **{
            "refagent:v1-overclaimed": {
                "command": ["{python}", REFAGENT, "--version", "1"],
                "state_schema": 1,
                "reads_state_schemas": [1, 2],
            }
        }
    )
    async with LocalDeployment(tmp_path, images) as dep:
        await dep.create_session("s", image="refagent:v2", instance="s-v2")
        client = dep.client()
        try:
            await client.post_message("s", "hello", id="m1")
        finally:
            await client.close()
        await _state_written(dep)  # before the snapshot: the shadow must meet it on restore
        record = dep.plan(
            "s",
            source=InstanceRef(name="s-v2", image="refagent:v2"),
            target_image="refagent:v1-overclaimed",
            policy=MigrationPolicy(phase_timeout_s=20.0),
        )
        record = await dep.migrate(record)
        assert record.phase is Phase.ROLLED_BACK
        assert record.failed_phase is Phase.RESTORING
        assert record.error is not None
        # Seen failing as it stops ("failed: SchemaTooNew ..."), or once it has exited
        # ("exited with code 1: SchemaTooNew ..."): the reason is in the record either way.
        assert "SchemaTooNew: refagent state has schema v2" in record.error, record.error
        assert "schema v2" in record.error
        # ... and the source never stopped serving.
        assert (await dep.runtime.status("s-v2")).ready


async def _state_written(dep: LocalDeployment, timeout_s: float = 30.0) -> None:
    """Until the owner has journaled its own state (its first turn is done)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        entries, _ = await dep.admin.journal("s", after=0, limit=1000)
        if any(e.kind == "state" for e in entries):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("the owner wrote no state")


async def test_an_instance_that_dies_before_its_code_runs_is_explained_by_its_log(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-agent.py"
    images = _images(**{"broken:v1": {"command": ["{python}", str(missing)]}})
    async with LocalDeployment(tmp_path / "work", images) as dep:
        with pytest.raises(RuntimeError) as started:
            await dep.create_session("s", image="broken:v1", instance="s-v1")
    assert "exited with code 2" in str(started.value)
    assert f"can't open file '{missing}'" in str(started.value)


def _agent(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = examples_dir() / "01-reference-agent" / "refagent.py"
    keep = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWPOD_")}
    return subprocess.run(
        [sys.executable, str(script), "--version", "1"],
        env={**keep, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_agent_writes_its_fatal_error_to_its_termination_log(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    result = _agent({"SHADOWPOD_TERMINATION_LOG": str(log)})  # no identity: cannot run
    assert result.returncode == 2
    assert log.read_text() == (
        "SHADOWPOD_IDENTITY_DIR is not set: point it at the agent's identity files"
    )


def test_an_agent_whose_identity_is_missing_says_so_in_its_termination_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "termination-log"
    result = _agent(
        {
            "SHADOWPOD_TERMINATION_LOG": str(log),
            "SHADOWPOD_IDENTITY_DIR": str(tmp_path / "identity"),
            "SHADOWPOD_EPOCH": "1",
            "SHADOWPOD_LISTEN": "127.0.0.1:0",
        }
    )
    assert result.returncode == 1
    assert log.read_text().startswith("FileNotFoundError: identity file ")


@pytest.mark.parametrize("where", ["missing-dir/termination-log", "a-file/termination-log"])
def test_an_unwritable_termination_log_does_not_change_how_the_agent_ends(
    tmp_path: Path, where: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    result = _agent({"SHADOWPOD_TERMINATION_LOG": str(tmp_path / where)})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: SHADOWPOD_IDENTITY_DIR is not set: point it at the agent's identity files"
    )


def test_an_instance_ended_by_a_signal_is_said_killed_not_explained_by_its_last_log_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / "agent.log"
    log.write_text('{"level":"info","msg":"serving as owner"}\n')
    assert exit_reason(-9, log) == "was killed by SIGKILL"
    assert exit_reason(-15, log) == "was killed by SIGTERM"
    # An exit of its own is still explained by its log when it wrote no reason.
    assert exit_reason(1, log) == 'exited with code 1: {"level":"info","msg":"serving as owner"}'
