"""What an agent instance leaves behind when it dies, found and killed.

An agent's background processes die with it (the parent-death signal, see
``shadowpod.agent.processes``), but their own children do not, nor anything else the
agent started (a tool's subprocess), and a ``kill -9`` leaves the agent no chance to
drain. Every process of an instance carries the instance's tag in its environment
(``SHADOWPOD_PROCESS_TAG``, inherited by everything it starts), so after the agent is
gone they can be found through ``/proc``, whatever process group they moved to, and
killed with their groups.

The inventory file the agent kept (``SHADOWPOD_PROCESS_INVENTORY``) says which of them
were its registered background processes and how the others ended: the drain report
the owner could not send is built from it and sent on its behalf, so the session's
process inventory never shows as running what no longer is.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shadowpod.agent.processes import ProcessInventory
from shadowpod.api.models import DrainReport, ProcessReport

TAG_ENV: Final = "SHADOWPOD_PROCESS_TAG"
INVENTORY_ENV: Final = "SHADOWPOD_PROCESS_INVENTORY"
# A process may start another while we look: look again, a few times.
_SWEEPS: Final = 3


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


@dataclass
class Reaped:
    """What the runtime did after an instance died."""

    killed: list[Leftover] = field(default_factory=list)
    report: DrainReport | None = None  # journaled on the dead owner's behalf

    def summary(self) -> list[str]:
        """One line per process: the owner's registered ones by name, then the rest."""
        lines = []
        named = set()
        if self.report is not None:
            for process in self.report.processes:
                named.add(process.pid)
                code = f", exit code {process.exit_code}" if process.outcome == "exited" else ""
                lines.append(f"{process.name} (pid {process.pid}): {process.outcome}{code}")
        lines += [
            f"pid {left.pid} ({left.command}): killed"
            for left in self.killed
            if left.pid not in named
        ]
        return lines


def kill_tagged(tag: str) -> list[Leftover]:
    """SIGKILL every process whose environment carries ``tag``, with its process group."""
    killed: dict[int, Leftover] = {}
    own_group = os.getpgid(0)
    for _ in range(_SWEEPS):
        found = [pid for pid in _pids() if pid not in killed and _tagged(pid, tag)]
        if not found:
            break
        for pid in found:
            killed[pid] = Leftover(pid, _command(pid))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != own_group:  # never ours, should one of them have joined it
                    os.killpg(group, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return sorted(killed.values(), key=lambda left: left.pid)


def still_running(tag: str, group: int) -> list[Leftover]:
    """Processes of a dead instance still there: any carrying its ``tag``, and any left
    in its process ``group`` (the group its first process led). Zombies do not count:
    they run nothing, and their parent reaps them."""
    found = [
        pid for pid in _pids() if (_tagged(pid, tag) or _group(pid) == group) and not _zombie(pid)
    ]
    return [Leftover(pid, _command(pid)) for pid in sorted(found)]


def drain_report(
    instance: str, inventory: ProcessInventory | None, exit_code: int
) -> DrainReport | None:
    """The report a dead owner would have sent: its registered processes, those still
    running when it died killed (by the kernel, as it died, or by us just now).
    ``None`` when there is nothing to report, or it drained and reported itself (it
    exited 0 with none left running)."""
    if inventory is None or inventory.epoch is None or not inventory.processes:
        return None
    if exit_code == 0 and all(p.outcome is not None for p in inventory.processes):
        return None
    return DrainReport(
        instance=instance,
        epoch=inventory.epoch,
        processes=[
            ProcessReport(
                name=process.name,
                pid=process.pid,
                outcome=process.outcome or "killed",
                exit_code=process.exit_code if process.outcome is not None else None,
            )
            for process in inventory.processes
        ],
    )


def process_children() -> dict[int, list[int]]:
    """The process tree now, from /proc: each parent's children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below ``root`` now, found through /proc (children in other process
    groups and sessions included: background processes start their own). Only while
    ``root`` lives: orphans are re-parented, which is why instances are tagged.
    ``children``: a tree read a moment ago by ``process_children``, shared by callers
    that ask about many roots at once (reading /proc costs one file per process)."""
    children = process_children() if children is None else children
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _tagged(pid: int, tag: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return False
    return f"{TAG_ENV}={tag}".encode() in environ.split(b"\0")


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after "pid (comm)": state, ppid, pgrp, ...
    (comm may hold spaces and parentheses); none for a process that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()


def _group(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def _zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return not fields or fields[0] == "Z"


def _command(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    command = " ".join(word.decode(errors="replace") for word in words if word)
    return command if len(command) <= 120 else command[:117] + "..."
