"""The migration engine as a process of its own, for the crash campaign.

``python -m shadowpod.bench.chaos_engine --records DIR --migration ID --gateway URL
--token-file FILE --runtime SOCKET [--pause-at PHASE]`` runs (or resumes) the stored
record ``ID`` to its end with the gateway's control API and the local runtime served
on ``SOCKET`` (see ``shadowpod.local.runtime_service``), as the operator would with
the Kubernetes API. It prints ``PHASE <phase>`` on every save of the record and
``DONE <phase>`` at the end; with ``--pause-at``, on the first save in that phase —
the phase's boundary, before it acts — it waits for a line on its stdin, so that
whoever runs it can strike (kill a component, or this process) right there.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from shadowpod import eventloop
from shadowpod.client.control import GatewayControl
from shadowpod.client.gateway import GatewayClient
from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.local.records import FileRecordStore
from shadowpod.local.runtime_service import RemoteRuntime


class AnnouncingRecords:
    """Saves records to ``inner``; says each phase on stdout and pauses at one."""

    def __init__(self, inner: FileRecordStore, pause_at: Phase | None) -> None:
        self.inner = inner
        self.pause_at = pause_at

    async def save(self, record: MigrationRecord) -> None:
        await self.inner.save(record)
        print(f"PHASE {record.phase.value}", flush=True)
        if record.phase is self.pause_at:
            self.pause_at = None  # once
            await asyncio.to_thread(sys.stdin.readline)

    async def load(self, migration_id: str) -> MigrationRecord | None:
        return await self.inner.load(migration_id)


async def resume(args: argparse.Namespace) -> Phase:
    records = AnnouncingRecords(
        FileRecordStore(args.records), Phase(args.pause_at) if args.pause_at else None
    )
    record = await records.load(args.migration)
    if record is None:
        raise SystemExit(f"no record of migration {args.migration!r} in {args.records}")
    token = args.token_file.read_text().strip()
    runtime = RemoteRuntime(args.runtime)
    async with GatewayClient(args.gateway, token) as admin:
        try:
            engine = MigrationEngine(runtime, GatewayControl(admin), records)
            done = await engine.run(record)
        finally:
            await runtime.close()
    print(f"DONE {done.phase.value}", flush=True)
    return done.phase


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shadowpod.bench.chaos_engine")
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--migration", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--runtime", type=Path, required=True)
    parser.add_argument("--pause-at", choices=[p.value for p in Phase], default=None)
    eventloop.exit_with_parent()
    eventloop.run(resume(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
