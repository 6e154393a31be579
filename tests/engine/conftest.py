"""Fixtures for migrations run for real: a gateway, reference agents, client load."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.record import MigrationPolicy, MigrationRecord, Phase
from shadowpod.local.records import FileRecordStore
from shadowpod.local.scenario import LiveScenario

Hook = Callable[[MigrationRecord], Awaitable[None]]


class EngineCrashed(BaseException):
    """Stands for the engine process dying (not an error the engine handles)."""


class HookedRecords:
    """A record store that runs a hook right after a record in a given phase is saved,
    i.e. at the phase boundary, before that phase acts."""

    def __init__(self, inner: FileRecordStore, hooks: dict[Phase, Hook]) -> None:
        self.inner = inner
        self.hooks = dict(hooks)

    async def save(self, record: MigrationRecord) -> None:
        await self.inner.save(record)
        hook = self.hooks.pop(record.phase, None)  # once per phase
        if hook is not None:
            await hook(record)

    async def load(self, migration_id: str) -> MigrationRecord | None:
        return await self.inner.load(migration_id)


def hooked_engine(scenario: LiveScenario, hooks: dict[Phase, Hook]) -> MigrationEngine:
    dep = scenario.deployment
    return MigrationEngine(dep.runtime, dep.control, HookedRecords(dep.records, hooks))


@pytest.fixture
async def scenario(tmp_path: Path) -> AsyncIterator[LiveScenario]:
    """Reference agent v1 serving 50 msg/s (enough to have messages in flight always)."""
    policy = MigrationPolicy(fence_timeout_s=1.0, max_fence_attempts=5, phase_timeout_s=20.0)
    async with LiveScenario(tmp_path, rate=50, policy=policy) as live:
        yield live
