"""``shadowpod bench gate``: what shadow compare costs, side by side in one run.

The same scenario twice — one session of the reference agent under ``rate`` client
messages a second, migrated ``migrations`` times (v1 → v2, then between two tags of
v2) — first without an upgrade gate, then with shadow compare on (``turns`` live
turns judged before each fence). Reported for each: the client's reply latency p50 /
p99 over the migration windows and over the whole run, the migrations' totals, and
with the gate the Validating phase's time. The judge is ``tool_calls`` (v1 and v2
word their replies differently on purpose; the cost measured is the comparison's,
not a verdict's).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowpod.bench.machine import MachineProbe
from shadowpod.engine.record import MigrationPolicy, Phase, ValidationPolicy
from shadowpod.gates.policy import GatePolicy
from shadowpod.local.figures import summarise
from shadowpod.local.load import Sent
from shadowpod.local.scenario import LiveScenario
from shadowpod.stats import percentile


@dataclass(frozen=True)
class GateBenchConfig:
    rate: float = 200.0
    migrations: int = 3
    turns: int = 5
    warmup_s: float = 2.0
    gap_s: float = 2.0
    workdir: Path | None = None


def _targets(count: int) -> list[str]:
    return ["refagent:v2" if n % 2 == 0 else "refagent:v2-b" for n in range(count)]


async def _series(config: GateBenchConfig, gated: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="shadowpod-bench-gate-", dir=config.workdir))
    validation = ValidationPolicy(
        turns=config.turns, timeout_s=30, gate=GatePolicy(judge="tool_calls")
    )
    policy = MigrationPolicy(max_fence_attempts=5, validation=validation if gated else None)
    try:
        async with LiveScenario(workdir, rate=config.rate, policy=policy) as scenario:
            await asyncio.sleep(config.warmup_s)
            for target in _targets(config.migrations):
                await scenario.migrate(target)
                await asyncio.sleep(config.gap_s)
            report = await scenario.finish()
            spans = [(m.started, m.ended) for m in report.migrations]

            def during(sent: Sent) -> bool:
                return any(start <= sent.at <= end for start, end in spans)

            windows = scenario.load.latencies(during)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    records = [m.record for m in report.migrations]
    v = report.verdict
    return {
        "gated": gated,
        "results": [r.phase.value for r in records],
        "migration_total_s": summarise([r.total_s or 0.0 for r in records]),
        "validating_s": summarise([r.phase_seconds().get(Phase.VALIDATING, 0.0) for r in records])
        if gated
        else None,
        "compared_turns": [r.validation.compared if r.validation else None for r in records],
        "latency_ms_during_migrations": {
            "p50": round(percentile(windows, 50) * 1000, 2),
            "p99": round(percentile(windows, 99) * 1000, 2),
            "messages": len(windows),
        },
        "latency_ms_whole_run": v.latency_ms,
        "invariants": {"lost": v.lost, "duplicated": v.duplicated, "reordered": v.reordered},
        "ok": report.ok and all(r.phase is Phase.SUCCEEDED for r in records),
    }


async def run_gate_bench(config: GateBenchConfig) -> dict[str, Any]:
    probe = MachineProbe()
    probe.start()
    without = await _series(config, gated=False)
    with_gate = await _series(config, gated=True)
    p99_off = without["latency_ms_during_migrations"]["p99"]
    p99_on = with_gate["latency_ms_during_migrations"]["p99"]
    added = (with_gate["migration_total_s"]["p50"] or 0.0) - (
        without["migration_total_s"]["p50"] or 0.0
    )
    return {
        "config": {
            "rate": config.rate,
            "migrations": config.migrations,
            "turns": config.turns,
        },
        "without_gate": without,
        "with_gate": with_gate,
        "p99_ratio_during_migrations": round(p99_on / p99_off, 3) if p99_off else None,
        "added_migration_s_p50": round(added, 3),
        "machine": probe.report(),
    }
