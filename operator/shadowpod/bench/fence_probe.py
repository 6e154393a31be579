"""A message that arrives during each fence: the fence pause as a client sees it.

The fence pause is the wait of the first message the fence held back. At a rate an
agent keeps up with, few messages arrive in the few milliseconds a fence holds
delivery, so most migrations have no pause to measure — and an agent with slow turns
(LangGraph at 1,000 turns of history) keeps up only with low rates. The probe sends
one more message of the session's load as each migration enters Fencing (after the
engine's record is saved, just before it asks the gateway to fence): a message that
arrives while delivery is held, whatever the rate. It is one of the load's messages
(checked for loss, duplicates and order like the others); its reply latency is the
pause as the client sees it — held, delivered to the new owner, answered there.

Each probe that waited for the new owner (``held`` or ``after``) has its pause split
(``breakdown``), from the gateway's journal timestamps, the fence's result and the new
owner's own report of its promotion (all on one machine's clock):

- ``source_turn_ms``: the fence's wait for the source to finish what it was
  delivered (quiescence): the source's in-flight turn, the agent's own cost;
- ``shadowpod_ms``: the rest until the new owner starts its first turn — the gate
  closing, the epoch bump, the shadow applying the marker and adopting, the held
  message's delivery (``marker_to_turn_ms`` of it from the epoch marker's journaling);
- ``new_owner_turn_ms``: from that turn's start to the probe's reply being journaled:
  the held turns on the new owner (the agent's own cost again, with their append);
- ``client_ms``: what is left of the reply latency (the client's sending and
  hearing back).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import aiohttp

from shadowpod.engine.ports import RecordStore
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.local.load import ClientLoad, Sent
from shadowpod.local.scenario import LiveScenario

# After the record is saved the engine sends the fence request: the probe leaves a
# little after it, so that it reaches the gateway once delivery is held.
DELAY_S: Final = 0.002
# How long after its migration succeeded a probe's reply is waited for, to split it.
SETTLE_S: Final = 10.0


class FenceProbe:
    """Installed as the engine's record store (wrapping the deployment's)."""

    def __init__(self, scenario: LiveScenario) -> None:
        self.scenario = scenario
        engine = scenario.deployment.engine
        self.records: RecordStore = engine.records
        engine.records = self
        self.probed: set[str] = set()  # migration ids (a fence retried is not probed again)
        self.probes: dict[str, tuple[ClientLoad, Sent]] = {}
        self.sent_at: dict[str, float] = {}  # Unix time each probe was sent
        self.breakdowns: dict[str, dict[str, float] | None] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def save(self, record: MigrationRecord) -> None:
        await self.records.save(record)
        migration = record.spec.id
        if record.phase is Phase.FENCING and migration not in self.probed:
            self.probed.add(migration)
            load = self.scenario.sessions[record.spec.session].load
            self._start(self._probe(migration, load))
        elif record.phase is Phase.SUCCEEDED and migration in self.probes:
            self._start(self._split(record))

    def _start(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the probes' breakdowns still being gathered."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def load(self, migration_id: str) -> MigrationRecord | None:
        return await self.records.load(migration_id)

    async def _probe(self, migration: str, load: ClientLoad) -> None:
        await asyncio.sleep(DELAY_S)
        message = load.extra("fence")
        self.probes[migration] = (load, message)
        self.sent_at[migration] = time.time()
        await load.send(message)

    async def _split(self, record: MigrationRecord) -> None:
        migration = record.spec.id
        load, sent = self.probes[migration]
        deadline = time.monotonic() + SETTLE_S
        # The reply is the client load's to record: polled, not awaited.
        while not load.replies.get(sent.seq or -1) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        self.breakdowns[migration] = await self._breakdown(record, sent)

    async def _breakdown(self, record: MigrationRecord, sent: Sent) -> dict[str, float] | None:
        fence, seq = record.fence, sent.seq
        instance = self.scenario.deployment.runtime.instance(record.spec.target.name)
        if fence is None or seq is None or instance is None:
            return None
        async with (
            aiohttp.ClientSession() as http,
            http.get(instance.url + "/v1/status", timeout=aiohttp.ClientTimeout(total=5)) as got,
        ):
            promotion = (await got.json()).get("promotion") or {}
        started = promotion.get("first_turn_at")
        if started is None or promotion.get("first_turn", seq + 1) > seq:
            return None  # the probe was not held for the new owner (the source answered)
        admin = self.scenario.deployment.admin
        entries, _ = await admin.journal(record.spec.session, after=fence.fence_seq - 1, limit=500)
        marker = next((e for e in entries if e.seq == fence.fence_seq), None)
        reply = next(
            (
                e
                for e in entries
                if e.kind == "message"
                and e.payload.get("role") == "assistant"
                and e.payload.get("turn") == seq
            ),
            None,
        )
        replies = self.scenario.sessions[record.spec.session].load.replies.get(seq)
        if marker is None or reply is None or not replies:
            return None
        sent_at = self.sent_at[record.spec.id]
        reply_ms = (replies[0].at - sent.at) * 1000
        # A probe that arrived after the new owner's first turn began waited for no one.
        to_turn_ms = max(0.0, started - sent_at) * 1000
        turn_ms = (reply.ts.timestamp() - max(started, sent_at)) * 1000
        return {
            "source_turn_ms": round(fence.waited_ms, 2),
            "shadowpod_ms": round(to_turn_ms - fence.waited_ms, 2),
            "marker_to_turn_ms": round((started - marker.ts.timestamp()) * 1000, 2),
            "new_owner_turn_ms": round(turn_ms, 2),
            "client_ms": round(reply_ms - to_turn_ms - turn_ms, 2),
        }

    def result(self, record: MigrationRecord) -> dict[str, Any] | None:
        """The probe's reply latency, and when it arrived: ``held`` (by the fence:
        the gateway measured its pause), ``before`` the hold (delivered to the source,
        which the fence then waited for), ``after`` the epoch moved (it waited for the
        new owner to be promoted)."""
        if record.spec.id not in self.probes:
            return None
        load, sent = self.probes[record.spec.id]
        replies = None if sent.seq is None else load.replies.get(sent.seq)
        if sent.seq is None or record.fence is None:
            arrived = None
        elif sent.seq > record.fence.fence_seq:
            arrived = "after"
        else:
            arrived = "held" if record.fence_pause_ms is not None else "before"
        return {
            "reply_ms": None if not replies else round((replies[0].at - sent.at) * 1000, 2),
            "arrived": arrived,
            "breakdown": self.breakdowns.get(record.spec.id),
        }
