"""examples/01-reference-agent/README.md's "Run it against a local gateway", run as
printed: its shell blocks one after the other in one bash (set -euo pipefail), from the
repository's root, then what the README says came of them checked through the
gateway: v1's replies, and v2 answering "hello again" with v1's memory after the
stop-and-recreate handover."""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
README = "examples/01-reference-agent/README.md"
SECTION = "## Run it against a local gateway"
WORKDIR = Path("/tmp/refagent")  # the README's own paths
GATEWAY = "http://127.0.0.1:8800"


def _readme_blocks() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("readme_blocks", str(REPO / "hack/readme-blocks"))
    module = ModuleType(loader.name)
    module.__file__ = loader.path
    loader.exec_module(module)
    return module


def _replies() -> list[str]:
    url = f"{GATEWAY}/v1/sessions/demo/events?kinds=message&limit=1000"
    with urllib.request.urlopen(url, timeout=5) as answer:
        page = json.load(answer)
    return [
        str(e["payload"]["content"])
        for e in page["events"]
        if e["payload"].get("role") == "assistant"
    ]


def _wait_replies(count: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        replies = _replies()
        if len(replies) >= count or time.monotonic() > deadline:
            return replies
        time.sleep(0.2)


@contextlib.contextmanager
def _script(text: str, log: Path) -> Iterator[subprocess.CompletedProcess[str]]:
    """Runs ``text`` in bash in a process group of its own, its output into ``log``
    (what it leaves running in the background holds a pipe open); whatever it left
    running (the gateway, the agents) is stopped on the way out."""
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", "set -euo pipefail\n" + text],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        process.wait(timeout=120)
        yield subprocess.CompletedProcess(process.args, process.returncode, log.read_text())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        time.sleep(1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_the_reference_agents_readme_runs_as_printed(tmp_path: Path) -> None:
    blocks = _readme_blocks().shell_blocks((REPO / README).read_text(), SECTION)
    assert len(blocks) == 5, f"{README} {SECTION!r}: the test reads five blocks"
    shutil.rmtree(WORKDIR, ignore_errors=True)  # what an earlier run left
    # One shell: the handover's "kill %2" names the agent a block before it started.
    with _script("\n".join(blocks), tmp_path / "readme.log") as run:
        assert run.returncode == 0, run.stdout
        replies = _wait_replies(5)
        # v1 met Ada; whatever v1 had not answered when stopped, v2 answered from the
        # journal, counting on from v1's turns; "hello again" is the fifth, with Ada's
        # name from v1's memory.
        assert replies[0] == "[v1] #1 nice to meet you (hi Ada)", run.stdout
        assert replies[-1] == "v2 > turn 5: hello again (hi Ada)", replies
        assert len(replies) == 5, replies
