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
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from shadowpod.engine.ports import RecordStore
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.local.load import ClientLoad, Sent
from shadowpod.local.scenario import LiveScenario

# After the record is saved the engine sends the fence request: the probe leaves a
# little after it, so that it reaches the gateway once delivery is held.
DELAY_S: Final = 0.002


class FenceProbe:
    """Installed as the engine's record store (wrapping the deployment's)."""

    def __init__(self, scenario: LiveScenario) -> None:
        self.scenario = scenario
        engine = scenario.deployment.engine
        self.records: RecordStore = engine.records
        engine.records = self
        self.probed: set[str] = set()  # migration ids (a fence retried is not probed again)
        self.probes: dict[str, tuple[ClientLoad, Sent]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def save(self, record: MigrationRecord) -> None:
        await self.records.save(record)
        migration = record.spec.id
        if record.phase is Phase.FENCING and migration not in self.probed:
            self.probed.add(migration)
            load = self.scenario.sessions[record.spec.session].load
            task = asyncio.create_task(self._probe(migration, load))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def load(self, migration_id: str) -> MigrationRecord | None:
        return await self.records.load(migration_id)

    async def _probe(self, migration: str, load: ClientLoad) -> None:
        await asyncio.sleep(DELAY_S)
        message = load.extra("fence")
        self.probes[migration] = (load, message)
        await load.send(message)

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
        }
