"""``shadowpod bench migrate --strategy criu``: the CRIU path against the app-level
state path, for agents holding more and more memory.

For each size, the reference agent v1 holds that much memory (every page written:
``REFAGENT_BALLAST_MB``) and serves a session under light client load; it is moved
once with the ``criu`` strategy (checkpointed while it serves, restored as the
shadow) and then once with the app-level ``shadow`` strategy (a snapshot, a new
process), same image. Reported per size: the checkpoint's time (fork and ``criu
dump``) and size, the restore's (``criu restore`` to a ready shadow, the Restoring
phase), against the snapshot's and the new process's restore on the app-level path,
each migration's total and client-visible pause, and the invariants the client saw.
Runs where CRIU runs (see docs/criu.md): in the CRIU image's container, as root.
"""

from __future__ import annotations

import asyncio
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shadowpod.bench.machine import MachineProbe
from shadowpod.local.criu import criu_unavailable, criu_version
from shadowpod.local.images import ImageMap
from shadowpod.local.outcome import MigrationOutcome
from shadowpod.local.scenario import LiveScenario

SIZES_MB: Final = (10, 100, 1024)
IMAGE: Final = "refagent:v1"


@dataclass(frozen=True)
class CriuBenchConfig:
    sizes_mb: tuple[int, ...] = SIZES_MB
    rate: float = 20.0
    serve_s: float = 1.0  # under load before and between the moves
    workdir: Path | None = None


def ballast_images(megabytes: int) -> ImageMap:
    return ImageMap.from_data(
        {
            "images": {
                IMAGE: {
                    "command": [
                        "{python}",
                        "{examples}/01-reference-agent/refagent.py",
                        "--version",
                        "1",
                    ],
                    "state_schema": 1,
                    "env": {"REFAGENT_BALLAST_MB": str(megabytes)},
                }
            }
        }
    )


def _phase(outcome: MigrationOutcome, phase: str) -> float | None:
    seconds = outcome.record.phase_seconds().get(phase)
    return None if seconds is None else round(seconds * 1000, 1)


def _figures(outcome: MigrationOutcome) -> dict[str, Any]:
    record = outcome.record
    return {
        "result": record.phase.value,
        "error": record.error,
        "snapshotting_ms": _phase(outcome, "Snapshotting"),
        "restoring_ms": _phase(outcome, "Restoring"),
        "total_ms": None if record.total_s is None else round(record.total_s * 1000, 1),
        "fence_pause_ms": record.fence_pause_ms,
        "client_max_latency_ms": None
        if outcome.client_max_latency_ms is None
        else round(outcome.client_max_latency_ms, 1),
    }


async def _one_size(config: CriuBenchConfig, megabytes: int, workdir: Path) -> dict[str, Any]:
    async with LiveScenario(
        workdir, rate=config.rate, images=ballast_images(megabytes), checkpoints=True
    ) as scenario:
        await asyncio.sleep(config.serve_s)
        criu = await scenario.migrate(IMAGE, strategy="criu")
        await asyncio.sleep(config.serve_s)
        state = await scenario.migrate(IMAGE, strategy="shadow")
        await asyncio.sleep(config.serve_s)
        report = await scenario.finish()
    record = criu.record
    return {
        "memory_mb": megabytes,
        "criu": _figures(criu)
        | {
            "checkpoint_ms": record.checkpoint_ms,
            "checkpoint_mb": None
            if record.checkpoint_bytes is None
            else round(record.checkpoint_bytes / 1024 / 1024, 1),
        },
        "state": _figures(state),
        "lost": report.verdict.lost,
        "duplicated": report.verdict.duplicated,
        "reordered": report.verdict.reordered,
        "checks_failed": [c.name for c in report.checks if not c.ok],
    }


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


async def run_criu_bench(config: CriuBenchConfig) -> dict[str, Any]:
    if reason := criu_unavailable():
        raise RuntimeError(f"CRIU cannot run here: {reason}")
    machine = MachineProbe()
    machine.start()
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="shadowpod-bench-criu-"))
    try:
        sizes = []
        for megabytes in config.sizes_mb:
            place = workdir / f"{megabytes}mb"
            place.mkdir(parents=True, exist_ok=True)
            sizes.append(await _one_size(config, megabytes, place))
    finally:
        if config.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "benchmark": "migrate",
        "strategy": "criu",
        "compared_with": "shadow (app-level state)",
        "rate": config.rate,
        "criu": criu_version(),
        "kernel": platform.release(),
        "memory_gib": _memory_gib(),
        "sizes": sizes,
        "machine": machine.report(),
    }
