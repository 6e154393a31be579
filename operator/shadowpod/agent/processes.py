"""Background processes of an owner: inventoried, and drained when the owner goes.

Draining sends SIGTERM to each process group, waits out the grace period, then sends
SIGKILL to whatever is left, and reports what happened to each process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from shadowpod.api.models import ProcessReport

logger = logging.getLogger(__name__)


@dataclass
class _Child:
    name: str
    process: asyncio.subprocess.Process


class ProcessRegistry:
    def __init__(self) -> None:
        self._children: dict[str, _Child] = {}

    async def spawn(self, name: str, command: Sequence[str]) -> int:
        if name in self._children and self._children[name].process.returncode is None:
            raise ValueError(f"a background process named {name!r} is already running")
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # its own process group: we can signal its children too
        )
        self._children[name] = _Child(name, process)
        return process.pid

    def inventory(self) -> list[dict[str, object]]:
        return [
            {"name": c.name, "pid": c.process.pid, "running": c.process.returncode is None}
            for c in self._children.values()
        ]

    async def drain(self, grace_s: float) -> list[ProcessReport]:
        """Stop every process: SIGTERM, ``grace_s``, then SIGKILL. Returns what happened."""
        reports: dict[str, ProcessReport] = {}
        running = []
        for child in self._children.values():
            if child.process.returncode is not None:
                reports[child.name] = ProcessReport(
                    name=child.name,
                    pid=child.process.pid,
                    outcome="exited",
                    exit_code=child.process.returncode,
                )
            else:
                _signal_group(child.process, signal.SIGTERM)
                running.append(child)
        if running:
            waits = [asyncio.create_task(c.process.wait()) for c in running]
            await asyncio.wait(waits, timeout=grace_s)
            for child, wait in zip(running, waits, strict=True):
                outcome = "terminated"
                if not wait.done():
                    _signal_group(child.process, signal.SIGKILL)
                    await child.process.wait()
                    outcome = "killed"
                    await asyncio.gather(wait, return_exceptions=True)
                reports[child.name] = ProcessReport(
                    name=child.name,
                    pid=child.process.pid,
                    outcome=outcome,
                    exit_code=child.process.returncode,
                )
                logger.info("background process %s %s", child.name, outcome)
        self._children.clear()
        return [reports[name] for name in sorted(reports)]


def _signal_group(process: asyncio.subprocess.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
