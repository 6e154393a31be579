"""``shadowpod bench chaos``: migrations under client load while a component is killed.

One gateway and the reference agent's sessions serve a steady client load. Each
migration is run by an engine in a process of its own (``shadowpod.bench.chaos_engine``,
reaching the local runtime over a socket, as an operator reaches the Kubernetes API),
and during each, one component gets ``kill -9`` at a phase drawn at random:

- ``gateway``: killed, then started again on the same journal and port;
- ``source`` or ``shadow``: the instance and all it started, as a pod's crash;
- ``engine``: its process; a new engine resumes the migration from its stored record.

The strike lands at the phase's boundary (the engine is held there, before the phase
acts) or a random moment after it, wherever the migration then is. Nothing outside the
engine restarts an instance of a migration: a source that dies before the bump is its to
replace (the shadow takes over, or a new owner of the source's image), a new owner
that crashes after it is the engine's to restart. After each migration, once every
message sent so far has been answered, the invariants are checked: no message lost,
duplicated or answered out of order, none answered later than ``answer_bound_s``; every
session's owner alive and serving (one found dead is counted, then started again so
that the campaign can go on — unless the strike came after the migration had ended:
that owner died outside any migration, and is restarted as its pod would be); no
process left of an instance that died (none carrying its tag, none in its process
group); no instance left running that owns no session. The campaign then goes on with
the next migration (v1 → v2, then between two tags of v2), and at the end runs the
live scenario's own checks over the whole journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shadowpod.bench.machine import LOOP_STEPS, MachineProbe
from shadowpod.engine.ports import InstanceSpec
from shadowpod.engine.record import (
    SHADOW_PHASES,
    TERMINAL,
    MigrationPolicy,
    MigrationRecord,
    Phase,
)
from shadowpod.eventloop import EXIT_WITH_PARENT_ENV
from shadowpod.local.checks import Check
from shadowpod.local.figures import combine, summarise
from shadowpod.local.orphans import Leftover, kill_tagged, still_running
from shadowpod.local.runtime import LocalInstance
from shadowpod.local.runtime_service import RuntimeService
from shadowpod.local.scenario import LiveScenario, LiveSession, ScenarioReport

VICTIMS: Final = ("gateway", "source", "shadow", "engine")
BOUNDARIES: Final = SHADOW_PHASES
# Where each victim can be struck: the shadow exists once Restoring has started it.
PHASES: Final = {
    "gateway": BOUNDARIES,
    "source": BOUNDARIES,
    "shadow": BOUNDARIES[2:],
    "engine": BOUNDARIES,
}
NEXT_IMAGE: Final = {
    "refagent:v1": "refagent:v2",
    "refagent:v2": "refagent:v2-b",
    "refagent:v2-b": "refagent:v2",
}
# A strike after the boundary comes 5 to 250 ms after it, log-uniformly: most phases
# take tens of milliseconds, starting a shadow most of a second.
DELAYS_S: Final = (0.005, 0.25)
# An instance that is not an owner any more is given this long to exit by itself.
EXIT_GRACE_S: Final = 10.0


class ChaosAborted(RuntimeError):
    """The campaign could not go on (not a broken invariant: a failure to run it)."""


@dataclass(frozen=True)
class Strike:
    victim: str
    phase: Phase
    delay_s: float  # 0: at the boundary, the engine held there; else this long after


@dataclass(frozen=True)
class ChaosConfig:
    migrations: int = 200
    seed: int = 1
    rate: float = 40.0
    sessions: int = 2
    journal_url: str | None = None  # SQLite in the working directory by default
    warmup_s: float = 1.0
    gap_s: float = 0.3
    # A session that answers nothing this long has lost what it still owes.
    settle_s: float = 30.0
    workdir: Path | None = None
    loop_steps: int = LOOP_STEPS
    # Every accepted message is answered within this (the campaign's phase timeout: no
    # phase may wait longer for what it needs, a dead source included).
    answer_bound_s: float = 20.0
    # These strikes, in order, instead of ``migrations`` drawn from ``seed``.
    strikes: tuple[Strike, ...] = ()


def plan_strikes(count: int, seed: int) -> list[Strike]:
    """``count`` strikes: every four consecutive ones hit the four victims, in a random
    order, each at a random phase where it exists; half at the boundary itself."""
    rng = random.Random(seed)
    strikes: list[Strike] = []
    while len(strikes) < count:
        for victim in rng.sample(VICTIMS, len(VICTIMS)):
            phase = rng.choice(PHASES[victim])
            at_boundary = rng.random() < 0.5 and not (
                victim == "shadow" and phase is Phase.RESTORING  # not started yet there
            )
            low, high = DELAYS_S
            delay = 0.0 if at_boundary else round(low * (high / low) ** rng.random(), 3)
            strikes.append(Strike(victim, phase, delay))
    return strikes[:count]


@dataclass
class StrikeResult:
    hit: bool = False  # the victim was running when struck
    struck_in: Phase | None = None  # the record's phase at that moment
    engine_restarts: int = 0
    killed: list[LocalInstance] = field(default_factory=list)


class ChaosEngine:
    """Runs one migration in an engine process, and strikes once as ``strike`` says."""

    def __init__(self, scenario: LiveScenario, socket: Path, strike: Strike) -> None:
        self.scenario = scenario
        self.socket = socket
        self.strike = strike
        self.result = StrikeResult()
        self._phase: Phase | None = None
        self._killed_engine: asyncio.subprocess.Process | None = None

    async def run(self, record: MigrationRecord) -> MigrationRecord:
        dep = self.scenario.deployment
        await dep.records.save(record)
        migration = record.spec.id
        engine = await self._spawn(migration, pause_at=self.strike.phase)
        striking: asyncio.Task[None] | None = None
        try:
            while True:
                assert engine.stdout is not None
                line = await engine.stdout.readline()
                if not line:
                    code = await engine.wait()
                    if engine is self._killed_engine:  # a new engine resumes the record
                        engine = await self._spawn(migration, pause_at=None)
                        self.result.engine_restarts += 1
                        continue
                    raise RuntimeError(
                        f"the engine of {migration} exited with code {code} before the end; "
                        f"see {self._log}"
                    )
                word, _, value = line.decode().strip().partition(" ")
                if word == "PHASE":
                    self._phase = Phase(value)
                    if self._phase is self.strike.phase and striking is None:
                        striking = asyncio.create_task(self._strike(record, engine))
                elif word == "DONE":
                    await engine.wait()
                    break
        finally:
            if striking is not None:
                await striking
            if engine.returncode is None:
                engine.kill()
                await engine.wait()
        stored = await dep.records.load(migration)
        assert stored is not None
        return stored

    @property
    def _log(self) -> Path:
        return self.scenario.workdir / "engine.log"

    async def _spawn(self, migration: str, pause_at: Phase | None) -> asyncio.subprocess.Process:
        dep = self.scenario.deployment
        command = [
            sys.executable, "-m", "shadowpod.bench.chaos_engine",
            "--records", str(dep.records.directory),
            "--migration", migration,
            "--gateway", dep.gateway.url,
            "--token-file", str(dep.gateway.workdir / "control-token"),
            "--runtime", str(self.socket),
        ]  # fmt: skip
        if pause_at is not None:
            command += ["--pause-at", pause_at.value]
        with self._log.open("ab") as sink:
            return await asyncio.create_subprocess_exec(
                *command,
                env={**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=sink,
                start_new_session=True,
            )

    @staticmethod
    def _release(engine: asyncio.subprocess.Process) -> None:
        """Let an engine held at the boundary go on."""
        if engine.stdin is not None and engine.returncode is None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                engine.stdin.write(b"go\n")

    async def _strike(self, record: MigrationRecord, engine: asyncio.subprocess.Process) -> None:
        strike, dep = self.strike, self.scenario.deployment
        if strike.delay_s:
            self._release(engine)
            await asyncio.sleep(strike.delay_s)
        self.result.struck_in = self._phase
        if strike.victim == "engine":
            if engine.returncode is None:
                self._killed_engine = engine
                engine.send_signal(signal.SIGKILL)
                self.result.hit = True
            return
        if strike.victim == "gateway":
            process = dep.gateway.process
            self.result.hit = process is not None and process.returncode is None
            await dep.gateway.stop(kill=True)
            self._release(engine)
            await dep.gateway.start()  # the same journal, the same port
            return
        name = record.spec.source.name if strike.victim == "source" else record.spec.target.name
        instance = dep.runtime.instance(name)
        if instance is not None and instance.process.returncode is None:
            self.result.hit = True
            self.result.killed.append(instance)
            await dep.runtime.kill(name)
        self._release(engine)


@dataclass
class Tally:
    """What the campaign found so far (each figure over all migrations)."""

    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    late: int = 0
    checked: set[tuple[str, int]] = field(default_factory=set)  # dead instances looked at


async def _dead_owners(scenario: LiveScenario, record: MigrationRecord) -> list[str]:
    """Sessions whose owner is dead once the migration has ended — a broken invariant:
    the engine must never leave one. Each is started again at its epoch, only so that
    the campaign can go on; then every owner must serve. The names found dead."""
    dep = scenario.deployment
    refs = (record.spec.source, record.spec.target, record.replacement)
    known = {ref.name: ref for ref in refs if ref is not None}
    known.update((live.owner.name, live.owner) for live in scenario.sessions.values())
    dead = []
    for live in scenario.sessions.values():
        ownership = await dep.control.ownership(live.name)  # asked again if it is away
        owner = known.get(ownership.owner or "")
        if owner is None:
            raise RuntimeError(f"session {live.name!r} is owned by {ownership.owner!r}, unknown")
        live.owner = owner
        instance = dep.runtime.instance(owner.name)
        if instance is None or instance.process.returncode is not None:
            await dep.runtime.start(
                InstanceSpec(
                    name=owner.name,
                    image=owner.image,
                    session=live.name,
                    mode="owner",
                    epoch=ownership.epoch,
                )
            )
            dead.append(owner.name)
        await dep.wait_serving(owner.name)
    return dead


async def _orphans(scenario: LiveScenario, struck: list[LocalInstance], tally: Tally) -> list[str]:
    """Processes of dead instances still running (each dead instance is looked at once);
    killed once found, so that the campaign goes on."""
    found = []
    for instance in [*struck, *scenario.deployment.runtime.instances()]:
        key = (instance.spec.name, instance.process.pid)
        if instance.process.returncode is None or key in tally.checked:
            continue
        tally.checked.add(key)
        if instance.reaping is not None:
            await instance.reaping
        left: list[Leftover] = await asyncio.to_thread(
            still_running, instance.tag, instance.process.pid
        )
        if left:
            found += [f"{instance.spec.name}: pid {p.pid} ({p.command})" for p in left]
            await asyncio.to_thread(kill_tagged, instance.tag)
            for leftover in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(leftover.pid, signal.SIGKILL)
    return found


async def _leftovers(scenario: LiveScenario) -> list[str]:
    """Instances still running that own no session, once given time to exit; stopped."""
    runtime = scenario.deployment.runtime
    owners = {live.owner.name for live in scenario.sessions.values()}
    deadline = time.monotonic() + EXIT_GRACE_S
    while True:
        extra = [
            i.spec.name
            for i in runtime.instances()
            if i.process.returncode is None and i.spec.name not in owners
        ]
        if not extra or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    for name in extra:
        await runtime.stop(name, grace_s=1.0)
    return extra


async def _migrate_once(
    scenario: LiveScenario,
    socket: Path,
    strike: Strike,
    live: LiveSession,
    tally: Tally,
    settle_s: float,
    bound_s: float,
) -> dict[str, Any]:
    started = time.monotonic()
    record = scenario.plan(NEXT_IMAGE[live.owner.image], session=live.name)
    engine = ChaosEngine(scenario, socket, strike)
    outcome = await scenario.run_migration(record, engine)
    done = outcome.record
    dead = await _dead_owners(scenario, done)
    # A strike that came after the migration ended (a delay past its last phase) killed
    # an owner outside any migration: the runtime's to restart, as a pod's would be
    # replaced by the operator — not the engine's.
    struck_in = engine.result.struck_in
    after_end = struck_in is not None and struck_in in TERMINAL
    restarted, dead = (dead, []) if after_end else ([], dead)
    # Every message sent until now must be answered; what is not, once the sessions
    # have stopped answering for ``settle_s``, is lost.
    cutoff = time.monotonic()
    loads = [s.load for s in scenario.sessions.values()]
    await asyncio.gather(*(load.wait_answered(settle_s, sent_before=cutoff) for load in loads))
    lost = sum(len(load.unanswered(cutoff)) for load in loads)
    verdict = combine(loads)
    answered = [a for load in loads for a in load.answered()]
    late = sum(1 for _, waited in answered if waited > bound_s)
    worst = max((waited for at, waited in answered if started <= at <= cutoff), default=0.0)
    figures = {
        "lost": lost - tally.lost,
        "duplicated": verdict.duplicated - tally.duplicated,
        "reordered": verdict.reordered - tally.reordered,
        "late": late - tally.late,
    }
    tally.lost, tally.duplicated, tally.reordered = lost, verdict.duplicated, verdict.reordered
    tally.late = late
    orphans = await _orphans(scenario, engine.result.killed, tally)
    leftovers = await _leftovers(scenario)
    return {
        "id": done.spec.id,
        "session": live.name,
        "source": done.spec.source.image,
        "target": done.spec.target.image,
        "victim": strike.victim,
        "phase": strike.phase.value,
        "delay_ms": round(strike.delay_s * 1000),
        "struck_in": None if engine.result.struck_in is None else engine.result.struck_in.value,
        "hit": engine.result.hit,
        "result": done.phase.value,
        "failed_phase": None if done.failed_phase is None else done.failed_phase.value,
        "error": done.error,
        "recoveries": done.recoveries,
        "source_lost": None if done.source_lost is None else done.source_lost.phase.value,
        "replacement": None if done.replacement is None else done.replacement.name,
        "engine_restarts": engine.result.engine_restarts,
        "dead_owners": dead,
        "owners_restarted": restarted,
        **figures,
        "worst_answer_s": round(worst, 3),
        "orphans": orphans,
        "leftovers": leftovers,
        "seconds": round(time.monotonic() - started, 2),
    }


async def run_chaos(
    config: ChaosConfig, progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The campaign; ``progress`` is given each migration's entry as it ends."""
    machine = MachineProbe(loop_steps=config.loop_steps)
    machine.start()
    began = time.monotonic()
    strikes = list(config.strikes) or plan_strikes(config.migrations, config.seed)
    workdir = Path(tempfile.mkdtemp(prefix="shadowpod-chaos-", dir=config.workdir))
    journal_url, drop = _journal(config.journal_url)
    policy = MigrationPolicy(fence_timeout_s=1.0, max_fence_attempts=5, phase_timeout_s=20.0)
    migrations: list[dict[str, Any]] = []
    try:
        async with LiveScenario(
            workdir,
            rate=config.rate,
            sessions=config.sessions,
            policy=policy,
            journal_url=journal_url,
        ) as scenario:
            # A Unix socket's path holds at most 107 bytes: not under a workdir that
            # may be long (a test's, or --workdir's), but in a short one of its own.
            socket = Path(tempfile.mkdtemp(prefix="shadowpod-")) / "runtime.sock"
            service = RuntimeService(scenario.deployment.runtime, socket)
            try:
                await service.start()
                await asyncio.sleep(config.warmup_s)
                names = list(scenario.sessions)
                tally = Tally()
                for n, strike in enumerate(strikes):
                    live = scenario.sessions[names[n % len(names)]]
                    entry = await _migrate_once(
                        scenario, socket, strike, live, tally, config.settle_s,
                        config.answer_bound_s,
                    )  # fmt: skip
                    migrations.append({"n": n, **entry})
                    if progress is not None:
                        progress(migrations[-1])
                    await asyncio.sleep(config.gap_s)
                final = await scenario.finish(drain_timeout_s=config.settle_s)
            finally:
                await service.close()
                shutil.rmtree(socket.parent, ignore_errors=True)
    except Exception as exc:
        # What went wrong is in the logs of the gateway, the engine and the instances.
        what = str(exc) or type(exc).__name__
        raise ChaosAborted(
            f"{what}, in migration {len(migrations)}; its logs are kept in {workdir}"
        ) from exc
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    finally:
        await drop()
    return _report(config, migrations, final, time.monotonic() - began, machine)


def _journal(url: str | None) -> tuple[str | None, Callable[[], Awaitable[None]]]:
    """The journal URL to run on, and what drops it afterwards: a PostgreSQL DSN gets a
    throw-away schema of its own; ``None`` is SQLite in the working directory."""

    async def nothing() -> None:
        return None

    if url is None or not url.startswith(("postgresql://", "postgres://")):
        return url, nothing
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    dsn = url

    async def drop() -> None:
        import psycopg

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    return f"{url}{'&' if '?' in url else '?'}shadowpod_schema={schema}", drop


INVARIANTS: Final = (
    "lost", "duplicated", "reordered", "late", "dead_owners", "orphans", "leftovers",
)  # fmt: skip


def broken_invariants(totals: dict[str, int], checks: list[Check]) -> list[str]:
    """What broke: an invariant with a count (see ``INVARIANTS``), or a check of the live
    scenario that failed. Under chaos a migration may roll back: that is the engine
    doing its job, not a broken invariant ("migrations succeeded" is left out)."""
    failed = [c.name for c in checks if not c.ok and c.name != "migrations succeeded"]
    return [name for name in INVARIANTS if totals[name]] + failed


def _report(
    config: ChaosConfig,
    migrations: list[dict[str, Any]],
    final: ScenarioReport,
    duration_s: float,
    machine: MachineProbe,
) -> dict[str, Any]:
    kills: dict[str, dict[str, int]] = {victim: {} for victim in VICTIMS}
    for m in migrations:
        by_phase = kills[m["victim"]]
        by_phase[m["phase"]] = by_phase.get(m["phase"], 0) + 1
    results: dict[str, int] = {}
    for m in migrations:
        results[m["result"]] = results.get(m["result"], 0) + 1
    v = final.verdict
    totals = {
        # The client's verdict over the whole run (each migration's share is in its entry).
        "lost": v.lost,
        "duplicated": v.duplicated,
        "reordered": v.reordered,
        "late": sum(m["late"] for m in migrations),
        "dead_owners": sum(len(m["dead_owners"]) for m in migrations),
        "orphans": sum(len(m["orphans"]) for m in migrations),
        "leftovers": sum(len(m["leftovers"]) for m in migrations),
    }
    broken = broken_invariants(totals, final.checks)
    return {
        "benchmark": "chaos",
        "seed": config.seed,
        "backend": "sqlite" if config.journal_url is None else "postgres",
        "rate": config.rate,
        "sessions": config.sessions,
        "migrations_run": len(migrations),
        "results": results,
        "succeeded": results.get(Phase.SUCCEEDED.value, 0),
        "rolled_back": results.get(Phase.ROLLED_BACK.value, 0),
        "failed": results.get(Phase.FAILED.value, 0),
        "kills": kills,
        "kills_at_boundary": sum(m["delay_ms"] == 0 for m in migrations),
        "victim_not_running": sum(not m["hit"] for m in migrations),
        "engine_restarts": sum(m["engine_restarts"] for m in migrations),
        "owner_restarts": sum(len(m["owners_restarted"]) for m in migrations),
        "sources_lost": sum(m["source_lost"] is not None for m in migrations),
        "replacements": sum(m["replacement"] is not None for m in migrations),
        **totals,
        "answer_bound_s": config.answer_bound_s,
        "worst_answer_s": max((m["worst_answer_s"] for m in migrations), default=0.0),
        "messages": {"sent": v.sent, "accepted": v.accepted, "answered": v.replied},
        "checks": [
            {"name": c.name, "ok": c.ok, "measured": c.measured, "detail": c.detail}
            for c in final.checks
        ],
        "duration_s": round(duration_s, 1),
        "migration_s": summarise([m["seconds"] for m in migrations]),
        "machine": machine.report(),
        "targets": {
            "invariants": {
                "target": "0 lost, 0 duplicated, 0 reordered, every accepted message answered"
                f" within {config.answer_bound_s:g} s, no dead owner, no orphan, no leftover"
                " instance, every check of the live scenario but 'migrations succeeded'",
                "measured": broken or "all held",
                "met": not broken,
            }
        },
        "migrations": migrations,
    }
