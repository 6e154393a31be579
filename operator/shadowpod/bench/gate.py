"""``shadowpod bench gate``: what shadow compare costs, side by side in one run.

One session of the reference agent under ``rate`` client messages a second is first
moved v1 → v2 (a warm-up, not counted), then migrated ``2 * migrations`` times
between v2 and v2-reworded (every reply worded differently: the semantic judge embeds
them all), alternately without an upgrade gate and with shadow compare on (``turns``
live turns judged before each fence); the order inside each pair alternates too, so
a machine that gets busier during the run weighs on both alike. The embedding model
is loaded before the load starts, outside every migration, as a deployment does at
start-up: its load time is reported on its own.

Reported for each mode: the client's reply latency p50 / p99 over the migration
windows, the migrations' totals; with the gate, the Validating phase split into the
window (from its start until the source acked the ``turns``-th live turn: the time
the policy asks for) and the gate's own overhead (the rest: noticing the window is
full, fetching the shadow's answers and the source's, judging).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowpod.bench.machine import MachineProbe
from shadowpod.engine.record import MigrationPolicy, MigrationRecord, Phase, ValidationPolicy
from shadowpod.gates.policy import GatePolicy, JudgeKind
from shadowpod.local.figures import summarise
from shadowpod.local.load import Sent
from shadowpod.local.outcome import MigrationOutcome
from shadowpod.local.scenario import LiveScenario
from shadowpod.local.subject import REFERENCE_NAME, reference_agent
from shadowpod.stats import percentile
from shadowpod.validator import prepare_judge


@dataclass(frozen=True)
class GateBenchConfig:
    rate: float = 200.0
    migrations: int = 3  # of each kind: with and without the gate
    turns: int = 5
    judge: JudgeKind = "semantic"
    warmup_s: float = 2.0
    gap_s: float = 2.0
    workdir: Path | None = None


def _order(pairs: int) -> list[bool]:
    """Gated or not, for each migration: pairs whose order alternates."""
    return [
        gated for n in range(pairs) for gated in ((False, True) if n % 2 == 0 else (True, False))
    ]


async def _window_filled(
    scenario: LiveScenario, record: MigrationRecord, turns: int
) -> float | None:
    """When the source acked the ``turns``-th live turn of the window (wall clock)."""
    after = record.validation_from
    if after is None:
        return None
    entries, _ = await scenario.deployment.admin.journal(
        record.spec.session, after=after, limit=5000
    )
    acks = [
        e for e in entries if e.kind == "ack" and isinstance(e.payload.get("turn"), int)
        and e.payload["turn"] > after
    ]  # fmt: skip
    return acks[turns - 1].ts.timestamp() if len(acks) >= turns else None


def _latency(scenario: LiveScenario, outcomes: list[MigrationOutcome]) -> dict[str, float]:
    spans = [(m.started, m.ended) for m in outcomes]

    def during(sent: Sent) -> bool:
        return any(start <= sent.at <= end for start, end in spans)

    windows = scenario.load.latencies(during)
    return {
        "p50": round(percentile(windows, 50) * 1000, 2),
        "p99": round(percentile(windows, 99) * 1000, 2),
        "messages": len(windows),
    }


async def run_gate_bench(config: GateBenchConfig) -> dict[str, Any]:
    probe = MachineProbe()
    probe.start()
    workdir = Path(tempfile.mkdtemp(prefix="shadowpod-bench-gate-", dir=config.workdir))
    gate = GatePolicy(judge=config.judge)
    plain = MigrationPolicy(max_fence_attempts=5)
    gated = plain.model_copy(
        update={"validation": ValidationPolicy(turns=config.turns, timeout_s=30, gate=gate)}
    )
    loading = time.monotonic()
    await prepare_judge(gate)  # before any load: what a deployment does at start-up
    model_load_s = time.monotonic() - loading
    # Both wordings name the user: the scenario's memory check reads the name alone.
    agent = dataclasses.replace(reference_agent(1.0), remembers=REFERENCE_NAME)
    try:
        async with LiveScenario(workdir, rate=config.rate, policy=plain, agent=agent) as scenario:
            await asyncio.sleep(config.warmup_s)
            await scenario.migrate("refagent:v2")  # v1 -> v2: not a pair's migration
            await asyncio.sleep(config.gap_s)
            runs: dict[bool, list[MigrationOutcome]] = {False: [], True: []}
            for n, on in enumerate(_order(config.migrations)):
                scenario.policy = gated if on else plain
                target = "refagent:v2-reworded" if n % 2 == 0 else "refagent:v2"
                runs[on].append(await scenario.migrate(target))
                await asyncio.sleep(config.gap_s)
            report = await scenario.finish()
            filled = [await _window_filled(scenario, m.record, config.turns) for m in runs[True]]
            series = {on: _series(runs[on], _latency(scenario, runs[on])) for on in runs}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    windows, overheads = [], []
    for outcome, at in zip(runs[True], filled, strict=True):
        timing = outcome.record.timings.get(Phase.VALIDATING)
        if at is None or timing is None or timing.ended is None:
            continue
        windows.append(at - timing.started)
        overheads.append((timing.ended - at) * 1000)
    with_gate = {
        **series[True],
        "validating_s": summarise(
            [m.record.phase_seconds().get(Phase.VALIDATING, 0.0) for m in runs[True]]
        ),
        "window_s": summarise(windows),
        "gate_overhead_ms": summarise(overheads),
        "compared_turns": [
            m.record.validation.compared if m.record.validation else None for m in runs[True]
        ],
    }
    p99_off = series[False]["latency_ms_during_migrations"]["p99"]
    p99_on = series[True]["latency_ms_during_migrations"]["p99"]
    totals = {on: [m.record.total_s or 0.0 for m in runs[on]] for on in runs}
    v = report.verdict
    return {
        "config": {
            "rate": config.rate,
            "migrations": config.migrations,
            "turns": config.turns,
            "judge": config.judge,
            "order": ["gate" if on else "plain" for on in _order(config.migrations)],
        },
        "semantic_model_load_s": round(model_load_s, 3),
        "without_gate": series[False],
        "with_gate": with_gate,
        "p99_ratio_during_migrations": round(p99_on / p99_off, 3) if p99_off else None,
        "added_migration_s_p50": round(
            statistics.median(totals[True]) - statistics.median(totals[False]), 3
        ),
        "latency_ms_whole_run": v.latency_ms,
        "invariants": {"lost": v.lost, "duplicated": v.duplicated, "reordered": v.reordered},
        "ok": report.ok and all(m.record.phase is Phase.SUCCEEDED for on in runs for m in runs[on]),
        "machine": probe.report(),
    }


def _series(outcomes: list[MigrationOutcome], latency: dict[str, float]) -> dict[str, Any]:
    records = [m.record for m in outcomes]
    return {
        "results": [r.phase.value for r in records],
        "migration_total_s": summarise([r.total_s or 0.0 for r in records]),
        "latency_ms_during_migrations": latency,
    }
