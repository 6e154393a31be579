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

Each probe's reply latency is split (``breakdown``), from the gateway's journal
timestamps and the new owner's own report of its promotion (one machine's clock):

- ``source_turn_ms``: until the source's last output before the epoch marker (its
  in-flight turn, which the fence waits out: the agent's own cost) — all of it, when
  the source answered the probe itself (``answered_by``);
- ``shadowpod_ms``: from then until the new owner starts its first turn — the gate
  closing, the epoch bump, the shadow applying the marker and adopting, the held
  message's delivery (``marker_to_turn_ms``: from the marker's journaling);
- ``new_owner_turn_ms``: from that turn's start to the probe's reply being journaled:
  the held turns on the new owner (the agent's own cost again, with their append);
- ``client_ms``: the rest of the reply latency (the client's send and hearing back).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import aiohttp

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind
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
        self.breakdowns: dict[str, dict[str, Any] | None] = {}
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

    async def _breakdown(self, record: MigrationRecord, sent: Sent) -> dict[str, Any] | None:
        seq = sent.seq
        instance = self.scenario.deployment.runtime.instance(record.spec.target.name)
        replies = self.scenario.sessions[record.spec.session].load.replies.get(seq or -1)
        if seq is None or instance is None or not replies:
            return None
        async with (
            aiohttp.ClientSession() as http,
            http.get(instance.url + "/v1/status", timeout=aiohttp.ClientTimeout(total=5)) as got,
        ):
            promotion = (await got.json()).get("promotion") or {}
        # The epoch marker the new owner was promoted by, the source's last output
        # before it, and the probe's reply.
        at = int(promotion["fence_seq"])
        entries, _ = await self.scenario.deployment.admin.journal(
            record.spec.session, after=max(0, min(at, seq) - 2), limit=500
        )
        marker = next((e for e in entries if e.seq == at), None)
        reply = next((e for e in entries if _replies_to(e, seq)), None)
        if marker is None or reply is None:
            return None
        sent_at = self.sent_at[record.spec.id]
        reply_ms = (replies[0].at - sent.at) * 1000
        journaled_ms = (reply.ts.timestamp() - sent_at) * 1000
        if reply.epoch < marker.epoch:  # the source answered it: its turn, all of it
            parts = {"source_turn_ms": journaled_ms, "shadowpod_ms": 0.0, "new_owner_turn_ms": 0.0}
            marker_to_turn = None
        elif promotion.get("first_turn_at") is None:
            return None
        else:
            source_end = max(
                (e.ts.timestamp() for e in entries if 0 < e.epoch < marker.epoch and e.seq < at),
                default=sent_at,
            )
            waited_source = max(sent_at, source_end)
            started = max(float(promotion["first_turn_at"]), waited_source)
            parts = {
                "source_turn_ms": (waited_source - sent_at) * 1000,
                "shadowpod_ms": (started - waited_source) * 1000,
                "new_owner_turn_ms": (reply.ts.timestamp() - started) * 1000,
            }
            marker_to_turn = (float(promotion["first_turn_at"]) - marker.ts.timestamp()) * 1000
        split: dict[str, Any] = {part: round(ms, 2) for part, ms in parts.items()}
        split["client_ms"] = round(reply_ms - journaled_ms, 2)
        split["marker_to_turn_ms"] = None if marker_to_turn is None else round(marker_to_turn, 2)
        split["answered_by"] = "source" if reply.epoch < marker.epoch else "new owner"
        return split

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


def _replies_to(entry: JournalEntry, seq: int) -> bool:
    return (
        entry.kind == EntryKind.MESSAGE
        and entry.payload.get("role") == "assistant"
        and entry.payload.get("turn") == seq
    )
