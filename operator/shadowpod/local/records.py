"""Migration records as JSON files, replaced atomically (write, fsync, rename)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from shadowpod.engine.record import MigrationRecord


class FileRecordStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, migration_id: str) -> Path:
        return self.directory / f"{migration_id}.json"

    async def save(self, record: MigrationRecord) -> None:
        await asyncio.to_thread(self._write, record)

    def _write(self, record: MigrationRecord) -> None:
        target = self._path(record.spec.id)
        temporary = target.with_suffix(".json.tmp")
        with temporary.open("w") as handle:
            handle.write(record.model_dump_json(indent=2))
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(target)

    async def load(self, migration_id: str) -> MigrationRecord | None:
        path = self._path(migration_id)
        if not path.exists():
            return None
        return MigrationRecord.model_validate_json(await asyncio.to_thread(path.read_text))
