"""An agent process ends without tearing its heap down (``exit_without_teardown``), and
still as the interpreter would: its exit code, other threads finished first, the
``atexit`` handlers an agent's libraries registered run, what it printed flushed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import atexit, sys, threading, time
from shadowpod.agent.main import exit_without_teardown

out = open(sys.argv[1], "a")

def late():
    time.sleep(0.3)
    out.write("thread finished\\n")
    out.flush()

atexit.register(lambda: (out.write("atexit ran\\n"), out.flush()))
threading.Thread(target=late).start()
print("printed, not flushed", end="")
exit_without_teardown(3)
print("never")
"""


def test_it_exits_with_its_code_after_threads_and_atexit(tmp_path: Path) -> None:
    record = tmp_path / "record"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(record)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == "printed, not flushed"
    # Threads are waited for before the atexit handlers, as at a normal exit.
    assert record.read_text().splitlines() == ["thread finished", "atexit ran"]
