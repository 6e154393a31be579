"""``agent.on_start``: run once as the process starts, so a warm spare pays a
framework's first run before it is handed a session — and an agent whose hook
fails still starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import asyncio, os, sys
from shadowpod.agent import Agent

agent = Agent("starting", version="1")
marker = sys.argv[1]

@agent.on_start
async def warm() -> None:
    await asyncio.sleep(0)  # on an event loop, as a framework's async run needs
    if os.environ.get("FAIL_START") == "1":
        raise RuntimeError("no luck warming up")
    with open(marker, "a") as out:
        out.write(f"started {os.getpid()} {asyncio.get_running_loop().is_running()}\\n")

@agent.on_message
async def answer(turn) -> None:
    await turn.reply(turn.content)

agent.run()
"""


def _warm_process(marker: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(marker)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SHADOWPOD_WARM": "1", **env},
    )


def _wait_for_file(path: Path, process: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 30
    while not path.exists() or not path.read_text().endswith("\n"):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the on_start hook did not run"
        time.sleep(0.02)
    return path.read_text()


def test_a_warm_spare_runs_it_before_it_is_handed_a_session(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    process = _warm_process(marker)
    try:
        # Nothing was written to its stdin yet: the spare is waiting to be needed.
        assert _wait_for_file(marker, process) == f"started {process.pid} True\n"
        assert process.poll() is None
        _, stderr = process.communicate(input="", timeout=30)  # not needed after all
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert marker.read_text().count("started") == 1  # once, not again on leaving


def test_a_failing_hook_is_logged_and_the_agent_still_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    process = _warm_process(marker, FAIL_START="1")
    try:
        # Still a spare waiting for its instance's environment: hand it nonsense, and
        # it answers as a spare does (exit 2) — it got past the failed hook.
        _, stderr = process.communicate(input="not json\n", timeout=30)
    finally:
        process.kill()
    assert process.returncode == 2, stderr
    assert "expects one JSON object of strings on stdin" in stderr
    assert "the on_start hook failed; the agent starts without it" in stderr
    assert "no luck warming up" in stderr
    assert not marker.exists()
