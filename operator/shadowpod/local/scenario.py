"""A live scenario: one session under steady client load, migrated while it serves.

Used by ``shadowpod demo``, ``shadowpod bench migrate`` and the migration tests. It
starts a gateway and an agent (``AgentUnderTest``: the reference agent v1 by
default), seeds a memory under the first version (its opening messages: "my name
is Ada"), drives client load, runs migrations through the engine, and finally checks
the invariants from the client's side and from the journal:

- no message lost, none answered twice, replies in order, each reply from exactly
  one version, versions changing only at migrations;
- every later version answers with the first one's memory (the agent's memory
  check: a text each of their replies carries);
- at each fence, the new owner's state equals the fold of the journal up to
  ``fence_seq`` (what the source would have had);
- schedules fired exactly once each; the source drained its background processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from shadowpod.agent.snapshots import state_digest
from shadowpod.api.models import ScheduleSpec
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import SessionState
from shadowpod.engine.record import (
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    Phase,
    Strategy,
)
from shadowpod.local.checks import Check, merge, session_checks
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.figures import combine, quiet_latency_maxima
from shadowpod.local.images import ImageMap
from shadowpod.local.load import ClientLoad, Verdict
from shadowpod.local.outcome import MigrationOutcome
from shadowpod.local.subject import REFERENCE_NAME, AgentUnderTest, reference_agent

SESSION: Final = "demo"
NAME: Final = REFERENCE_NAME
CREDENTIAL: Final = "weather-api"
DIGEST: Final = (ScheduleSpec(schedule_id="digest", every_s=2.0, content="daily digest"),)
# A migration's window opens a little before it: messages sent just before may wait on it.
WINDOW_LEAD_S: Final = 0.05


class Engine(Protocol):
    """What runs a migration: ``MigrationEngine``, or one in a process of its own."""

    async def run(self, record: MigrationRecord) -> MigrationRecord: ...


@dataclass
class ScenarioReport:
    verdict: Verdict
    migrations: list[MigrationOutcome]
    checks: list[Check] = field(default_factory=list)
    # Worst client latency per session in windows as long as a migration's with no
    # migration running (see ``quiet_latency_maxima``), in ms.
    quiet_max_latency_ms: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


@dataclass
class LiveSession:
    """One session of the scenario: its current owner and its client load."""

    name: str
    owner: InstanceRef
    load: ClientLoad
    migrations: list[MigrationOutcome] = field(default_factory=list)
    watcher: asyncio.Task[None] | None = None
    sender: asyncio.Task[None] | None = None


class LiveScenario:
    """``sessions`` sessions of ``agent`` (the reference agent by default) share
    ``rate`` msg/s of client load."""

    def __init__(
        self,
        workdir: Path,
        *,
        rate: float,
        sessions: int = 1,
        images: ImageMap | None = None,
        heartbeat_s: float = 1.0,
        policy: MigrationPolicy | None = None,
        on_phase: Callable[[MigrationRecord], None] | None = None,
        warm_spares: bool = False,
        journal_url: str | None = None,
        checkpoints: bool = False,
        agent: AgentUnderTest | None = None,
        schedules: Sequence[ScheduleSpec] = DIGEST,
    ) -> None:
        """``schedules``: each session's (a 2 s digest by default, so that every run
        shows fires journaled once across its moves)."""
        if sessions < 1:
            raise ValueError("a scenario needs at least one session")
        self.workdir = workdir
        self.rate = rate
        self.session_count = sessions
        self.agent = agent or reference_agent(heartbeat_s)
        self.schedules = list(schedules)
        self.deployment = LocalDeployment(
            workdir,
            images or self.agent.images,
            warm_spares=warm_spares,
            journal_url=journal_url,
            checkpoints=checkpoints,
        )
        self.first_version = "1"  # what the first owner's replies say (``meta.version``)
        self.policy = policy or MigrationPolicy()
        self.on_phase = on_phase
        self.client: GatewayClient | None = None
        self.sessions: dict[str, LiveSession] = {}
        self.migrations: list[MigrationOutcome] = []
        self._stop = asyncio.Event()

    # The single-session view (the demo, and most tests, run one session).
    @property
    def main(self) -> LiveSession:
        return next(iter(self.sessions.values()))

    @property
    def owner(self) -> InstanceRef:
        return self.main.owner

    @property
    def load(self) -> ClientLoad:
        return self.main.load

    async def __aenter__(self) -> LiveScenario:
        await self.deployment.__aenter__()
        try:
            await self._start()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        for live in self.sessions.values():
            for task in (live.sender, live.watcher):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        if self.client is not None:
            await self.client.close()
        await self.deployment.__aexit__(None, None, None)

    async def _start(self) -> None:
        dep = self.deployment
        dep.add_credential(CREDENTIAL, "demo-key")
        self.client = dep.client()
        names = (
            [SESSION]
            if self.session_count == 1
            else [f"{SESSION}-{n}" for n in range(self.session_count)]
        )
        for name in names:
            owner = InstanceRef(name=f"{name}-v1", image=self.agent.source)
            await dep.create_session(
                name,
                image=owner.image,
                instance=owner.name,
                credentials=[CREDENTIAL],
                schedules=self.schedules,
            )
            load = ClientLoad(self.client, name, self.rate / len(names), message=self.agent.message)
            live = LiveSession(name, owner, load)
            live.watcher = asyncio.create_task(live.load.watch(), name=f"watch-replies-{name}")
            self.sessions[name] = live
        for live in self.sessions.values():
            # A memory written under the first version, which later ones must answer with.
            for n, text in enumerate(self.agent.seed):
                seed = await self.client.post_message(live.name, text, id=f"seed-{n}")
                await self._wait_reply(live, seed.seq)
                self.first_version = live.load.replies[seed.seq][0].version
        for live in self.sessions.values():
            live.sender = asyncio.create_task(
                live.load.run(self._stop), name=f"client-load-{live.name}"
            )

    async def _wait_reply(self, live: LiveSession, seq: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while seq not in live.load.replies:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply to seq {seq} of {live.name} within {timeout_s}s")
            await asyncio.sleep(0.01)

    # --- migrating ----------------------------------------------------------------------

    def plan(
        self, target_image: str, *, strategy: Strategy = "shadow", session: str | None = None
    ) -> MigrationRecord:
        """A migration of ``session`` (the first by default) from its owner to ``target_image``."""
        live = self.sessions[session] if session is not None else self.main
        return self.deployment.plan(
            live.name,
            source=live.owner,
            target_image=target_image,
            strategy=strategy,
            credentials=[CREDENTIAL],
            policy=self.policy,
        )

    async def migrate(
        self, target_image: str, *, strategy: Strategy = "shadow", session: str | None = None
    ) -> MigrationOutcome:
        return await self.run_migration(self.plan(target_image, strategy=strategy, session=session))

    async def run_migration(
        self, record: MigrationRecord, engine: Engine | None = None
    ) -> MigrationOutcome:
        """Run (or resume) ``record`` with ``engine`` (the deployment's by default)."""
        engine = engine or self.deployment.engine
        live = self.sessions[record.spec.session]
        if self.on_phase is not None:
            self.on_phase(record)
        started = time.monotonic()
        watch = asyncio.create_task(self._watch_phases(record.spec.id))
        try:
            record = await engine.run(record)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        ended = time.monotonic()
        if self.on_phase is not None:
            self.on_phase(record)
        if record.phase is Phase.SUCCEEDED:
            live.owner = record.spec.target
        elif record.phase is Phase.FAILED or record.replacement is not None:
            # Failed after the bump, the target may own the session; a rollback from a
            # dead source left a new owner of its image: follow the truth.
            ownership = await self.deployment.control.ownership(live.name)
            for owner in (record.spec.target, record.replacement):
                if owner is not None and ownership.owner == owner.name:
                    live.owner = owner
        outcome = MigrationOutcome(
            record=record, started=started, ended=ended, promoted=await self._promoted(record)
        )
        live.migrations.append(outcome)
        self.migrations.append(outcome)
        return outcome

    async def _watch_phases(self, migration_id: str) -> None:
        if self.on_phase is None:
            return
        last: Phase | None = None
        while True:
            record = await self.deployment.records.load(migration_id)
            if record is not None and record.phase is not last:
                last = record.phase
                self.on_phase(record)
            await asyncio.sleep(0.02)

    async def _promoted(self, record: MigrationRecord) -> tuple[int, str] | None:
        """What the new owner reports of its state at the cutover (shadow strategy)."""
        if record.spec.strategy == "restart" or record.phase is not Phase.SUCCEEDED:
            return None
        if record.recoveries:
            return None  # restarted as owner after the cutover: it was never promoted
        for _ in range(20):  # a busy instance may not answer at once
            promoted = await self.deployment.runtime.promoted_state_digest(record.spec.target.name)
            if promoted is not None:
                return promoted
            await asyncio.sleep(0.1)
        return None

    @staticmethod
    def _verify_states(live: LiveSession, journal: list[JournalEntry]) -> None:
        """Each promoted state against one incremental fold of the journal.

        Done once at the end, after the load: folding a long journal is work the
        benchmark must not add to the system it is measuring.
        """
        folder = StateFolder(SessionState())
        promoted = [(m.promoted, m) for m in live.migrations if m.promoted is not None]
        at = 0
        for (fence_seq, digest), outcome in sorted(promoted, key=lambda p: p[0][0]):
            while at < len(journal) and journal[at].seq <= fence_seq:
                folder.apply(journal[at])
                at += 1
            outcome.state_matches = state_digest(folder.peek()) == digest

    async def journal(
        self, session: str = SESSION, *, through: int | None = None
    ) -> list[JournalEntry]:
        entries: list[JournalEntry] = []
        after = 0
        while through is None or after < through:
            page, head = await self.deployment.admin.journal(session, after=after, limit=10_000)
            page = [e for e in page if through is None or e.seq <= through]
            if not page:
                break
            entries += page
            after = page[-1].seq
            if after >= head:
                break
        return entries

    # --- finishing ----------------------------------------------------------------------

    def oldest_wait_s(self) -> float:
        """The longest any message still without a reply has waited, over all sessions."""
        return max((live.load.oldest_wait_s() for live in self.sessions.values()), default=0.0)

    async def stop_load(self) -> None:
        """Stop sending; returns once every message sent has been accepted (or given up)."""
        self._stop.set()
        for live in self.sessions.values():
            if live.sender is not None:
                await live.sender

    async def finish(self, *, drain_timeout_s: float = 30.0) -> ScenarioReport:
        """Stop the load, wait for every reply, and check the invariants.

        A message is lost only if no reply to it came while its session went
        ``drain_timeout_s`` without answering anything: a backlog still being worked
        through (a machine slower than the rate) is waited for.
        """
        await self.stop_load()
        await asyncio.gather(
            *(live.load.wait_answered(drain_timeout_s) for live in self.sessions.values())
        )
        for outcome in self.migrations:
            live = self.sessions[outcome.record.spec.session]
            latencies = live.load.latencies(self._window(outcome))
            outcome.client_max_latency_ms = max(latencies) * 1000 if latencies else None
            source = self.deployment.runtime.instance(outcome.record.spec.source.name)
            outcome.source_exit = None if source is None else source.process.returncode
        checks: dict[str, list[Check]] = {}
        for live in self.sessions.values():
            journal = await self.journal(live.name)
            self._verify_states(live, journal)
            for check in session_checks(
                live.migrations,
                live.load,
                journal,
                remembers=self.agent.remembers,
                first_version=self.first_version,
            ):
                checks.setdefault(check.name, []).append(check)
        verdict = combine([live.load for live in self.sessions.values()])
        report = ScenarioReport(verdict=verdict, migrations=self.migrations)
        report.checks = [merge(name, found, len(self.sessions)) for name, found in checks.items()]
        report.quiet_max_latency_ms = self._quiet_maxima_ms()
        return report

    def _window(self, outcome: MigrationOutcome) -> Callable[[Any], bool]:
        # Messages sent while the migration ran (and just before: they may wait on it).
        start, end = outcome.started - WINDOW_LEAD_S, outcome.ended
        return lambda sent: start <= sent.at <= end

    def _quiet_maxima_ms(self) -> list[float]:
        """The same measure as a migration's client max latency, in windows of the
        same (median) length with no migration running."""
        if not self.migrations:
            return []
        busy = [(m.started - WINDOW_LEAD_S, m.ended) for m in self.migrations]
        length = statistics.median(end - start for start, end in busy)
        loads = [live.load for live in self.sessions.values()]
        return [s * 1000 for s in quiet_latency_maxima(loads, busy, length)]
