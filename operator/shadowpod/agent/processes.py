"""Background processes of an owner: inventoried, and drained when the owner goes.

Each process runs in a process group of its own, so that its children can be
signalled with it, and dies with this process: the kernel SIGKILLs it when its parent
dies (Linux's parent-death signal), however the parent dies — a ``kill -9`` of an
owner leaves nothing working on for an owner that no longer exists. Its own children
get no such signal: whoever started this process cleans up after it (the local
runtime does, see ``shadowpod.local.orphans``), from the inventory file.

Draining sends SIGTERM to each process group — also the group of a process that
already exited, whose children may live on — waits out the grace period, then sends
SIGKILL to whatever is left, and reports what happened to each process.

The inventory file (``SHADOWPOD_PROCESS_INVENTORY``), when there is one, lists every
process with its pid (= its process group) and how it ended, rewritten as processes
start and end: what a dead owner can no longer report, whoever cleans up after it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

from shadowpod.api.agent import BackgroundProcess
from shadowpod.api.models import ProcessReport

logger = logging.getLogger(__name__)
_PR_SET_PDEATHSIG: Final = 1
# How often a drain looks whether what it signalled is gone, once the processes
# themselves have exited (their children may take longer).
_GROUP_POLL_S: Final = 0.02

Outcome = Literal["exited", "terminated", "killed"]


class InventoryProcess(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    pid: int
    outcome: Outcome | None = None  # None: running
    exit_code: int | None = None


class ProcessInventory(BaseModel):
    """The inventory file: the owner epoch the processes work for, and the processes."""

    model_config = ConfigDict(extra="forbid")

    epoch: int | None = None
    processes: list[InventoryProcess] = []

    @classmethod
    def read(cls, path: Path) -> ProcessInventory | None:
        """The inventory in ``path``; ``None`` if there is none (or it is unreadable)."""
        try:
            return cls.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            return None


@dataclass
class _Child:
    name: str
    process: asyncio.subprocess.Process
    outcome: Outcome | None = None
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class ProcessRegistry:
    def __init__(self, inventory: Path | None = None) -> None:
        self._children: dict[str, _Child] = {}
        self._inventory = inventory
        self.epoch: int | None = None  # the owner epoch the processes are started at

    async def spawn(self, name: str, command: Sequence[str]) -> int:
        if name in self._children and self._children[name].process.returncode is None:
            raise ValueError(f"a background process named {name!r} is already running")
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # its own process group: we can signal its children too
            preexec_fn=_dies_with(os.getpid()),
        )
        child = _Child(name, process)
        child.watcher = asyncio.create_task(self._watch(child), name=f"process-{name}")
        self._children[name] = child
        self._write_inventory()
        return process.pid

    def inventory(self) -> list[BackgroundProcess]:
        return [
            BackgroundProcess(name=c.name, pid=c.process.pid, running=c.process.returncode is None)
            for c in self._children.values()
        ]

    async def drain(self, grace_s: float) -> list[ProcessReport]:
        """Stop every process and its group: SIGTERM, ``grace_s``, then SIGKILL.
        Returns what happened to each."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        children = list(self._children.values())
        for child in children:
            if child.watcher is not None:
                child.watcher.cancel()
            if child.process.returncode is not None or not _exists(child.process.pid):
                # Gone before the drain began (reaped, its return code perhaps not yet
                # delivered to this loop): it exited by itself, whatever comes after.
                child.outcome = "exited"
            # Also the group of one that exited: the children it left are still in it
            # (and keep its number taken while they are).
            _signal_group(child.process.pid, signal.SIGTERM)
        running = [c for c in children if c.outcome is None]
        if running:
            waits = [asyncio.create_task(c.process.wait()) for c in running]
            await asyncio.wait(waits, timeout=grace_s)
            for wait in waits:
                wait.cancel()
        # What a process started may outlive it: its group is polled, having no event.
        while not all(_ended(c) for c in children) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_GROUP_POLL_S)
        for child in children:
            if not _ended(child):
                if child.process.returncode is None:
                    child.outcome = child.outcome or "killed"
                # Else only what it left behind is killed: it ended when asked.
                _signal_group(child.process.pid, signal.SIGKILL)
            await child.process.wait()
            child.outcome = child.outcome or "terminated"
            logger.info("background process %s %s", child.name, child.outcome)
        self._write_inventory()
        self._children.clear()
        return [
            ProcessReport(
                name=c.name, pid=c.process.pid, outcome=c.outcome, exit_code=c.process.returncode
            )
            for c in sorted(children, key=lambda c: c.name)
            if c.outcome is not None
        ]

    async def _watch(self, child: _Child) -> None:
        await child.process.wait()
        child.outcome = child.outcome or "exited"
        self._write_inventory()

    def _write_inventory(self) -> None:
        if self._inventory is None:
            return
        inventory = ProcessInventory(
            epoch=self.epoch,
            processes=[
                InventoryProcess(
                    name=c.name,
                    pid=c.process.pid,
                    outcome=c.outcome,
                    exit_code=c.process.returncode,
                )
                for c in self._children.values()
            ],
        )
        temporary = self._inventory.with_name(f".{self._inventory.name}.tmp")
        try:
            temporary.write_bytes(inventory.model_dump_json().encode())
            temporary.replace(self._inventory)
        except OSError as exc:
            logger.warning("could not write the process inventory %s: %s", self._inventory, exc)


def _dies_with(parent: int) -> Callable[[], None] | None:
    """What a child runs before its command: ask for SIGKILL when ``parent`` dies.

    Looked up here, in the parent: the child, forked from a process with threads,
    must not load libraries. ``None`` where there is no ``prctl`` (not Linux).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before we asked
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_parent


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ended(child: _Child) -> bool:
    """The process has exited and so has every process left in its group."""
    if child.process.returncode is None:
        return False
    try:
        os.killpg(child.process.pid, 0)
    except (ProcessLookupError, PermissionError):
        return True
    return False
