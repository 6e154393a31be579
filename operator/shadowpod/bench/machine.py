"""What the machine was like while a benchmark ran, so its figures can be read.

Machines of one kind differ, and one machine differs from minute to minute (a virtual
machine shares its host): the same build has given a migration's fence pause p99 of
28 ms and of 106 ms on two machines sold as alike. Every benchmark report therefore
carries:

- ``python_loop_s`` — the time of a 10-million-step Python loop, the median of three,
  just before and just after the run: the speed of one core for the interpreter's work
  (the median, not the best: a shared host's bursts of slowness are part of the
  figure);
- ``cpu`` — over the run, from ``/proc/stat`` (Linux): the share of all cores that was
  busy (``busy_pct``, what the run left of the machine) and the share the hypervisor
  gave to other guests (``steal_pct``).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

LOOP_STEPS: Final = 10_000_000
PROC_STAT: Final = Path("/proc/stat")


def python_loop_s(steps: int = LOOP_STEPS, rounds: int = 3) -> float:
    """Seconds for ``steps`` iterations of an empty Python loop, median of ``rounds``."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(steps):
            pass
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@dataclass(frozen=True)
class CpuTimes:
    busy: int
    steal: int
    total: int

    @classmethod
    def read(cls, path: Path = PROC_STAT) -> CpuTimes | None:
        """The machine's cumulative CPU ticks, or ``None`` where there is no /proc/stat."""
        try:
            first = path.read_text().splitlines()[0].split()
        except (OSError, IndexError):
            return None
        if first[0] != "cpu":
            return None
        # user nice system idle iowait irq softirq steal [guest guest_nice: inside user]
        ticks = [int(v) for v in first[1:9]]
        idle = ticks[3] + ticks[4]
        steal = ticks[7]
        total = sum(ticks)
        return cls(busy=total - idle - steal, steal=steal, total=total)

    def since(self, earlier: CpuTimes) -> dict[str, float] | None:
        elapsed = self.total - earlier.total
        if elapsed <= 0:
            return None
        return {
            "busy_pct": round(100 * (self.busy - earlier.busy) / elapsed, 1),
            "steal_pct": round(100 * (self.steal - earlier.steal) / elapsed, 1),
        }


class MachineProbe:
    """``start()`` before the run, ``report()`` after it: the ``machine`` of a report."""

    def __init__(self, *, loop_steps: int = LOOP_STEPS) -> None:
        self._loop_steps = loop_steps
        self._loop_before: float | None = None
        self._cpu_before: CpuTimes | None = None

    def start(self) -> None:
        self._loop_before = python_loop_s(self._loop_steps)
        self._cpu_before = CpuTimes.read()

    def report(self) -> dict[str, Any]:
        cpu_after = CpuTimes.read()
        cpu = (
            cpu_after.since(self._cpu_before)
            if cpu_after is not None and self._cpu_before is not None
            else None
        )
        return {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "python_loop_s": {
                "steps": self._loop_steps,
                "before": None if self._loop_before is None else round(self._loop_before, 4),
                "after": round(python_loop_s(self._loop_steps), 4),
            },
            "cpu": cpu,
        }
