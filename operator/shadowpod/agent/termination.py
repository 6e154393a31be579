"""The agent's last word: why it stopped, written where whoever runs it will look.

Kubernetes reads a container's ``terminationMessagePath`` (``/dev/termination-log`` by
default) into the pod's ``state.terminated.message`` when the container exits; the
local runtime reads the same file into ``InstanceStatus.error``. So the reason a
migration's target refused to start (it cannot read the source's state schema, a
bad setting) reaches the migration's record instead of staying in the instance's log.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

TERMINATION_LOG_ENV: Final = "SHADOWPOD_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"
# Kubernetes keeps at most 4096 bytes of a termination message.
MAX_BYTES: Final = 4096


def write_termination_message(message: str) -> None:
    """Write ``message`` to ``$SHADOWPOD_TERMINATION_LOG`` (default
    ``/dev/termination-log``). Best effort: a missing directory or a file this process
    may not write is no reason to fail any further."""
    path = Path(os.environ.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG)
    with contextlib.suppress(OSError):
        path.write_bytes(_clip(message))


def read_termination_message(path: Path) -> str | None:
    """The message an instance left in ``path``, or ``None`` (none, or unreadable)."""
    try:
        text = path.read_bytes()[:MAX_BYTES].decode(errors="replace").strip()
    except OSError:
        return None
    return text or None


def _clip(message: str) -> bytes:
    data = message.encode()
    if len(data) <= MAX_BYTES:
        return data
    return data[: MAX_BYTES - 3].decode(errors="ignore").encode() + b"..."
