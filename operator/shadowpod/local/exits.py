"""Why a local instance ended, as a pod's ``state.terminated`` would tell it.

The agent writes its fatal error to its termination log (see
``shadowpod.agent.termination``); when it wrote nothing and failed — it crashed
before its own code ran, say — the last line of its log stands in, as with
Kubernetes' ``terminationMessagePolicy: FallbackToLogsOnError``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Final

from shadowpod.agent.termination import read_termination_message

TERMINATION_LOG: Final = "termination-log"  # in the instance's directory, next to its log
LOG_TAIL_BYTES: Final = 1024


def exit_reason(code: int, log: Path) -> str:
    """``exited with code N``, and the reason the instance whose log is ``log`` gave;
    ``was killed by SIGNAL`` when a signal ended it (its log's last line is then only
    what it was doing, not why it ended)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    reason = f"exited with code {code}"
    message = read_termination_message(log.parent / TERMINATION_LOG)
    if message is None and code:
        message = last_line(log)
    return f"{reason}: {message}" if message else reason


def last_line(log: Path) -> str | None:
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else None
