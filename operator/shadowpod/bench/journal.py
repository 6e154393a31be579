"""``shadowpod bench journal``: what the journal store costs on this machine.

Figures (keys of the JSON report):

- ``appends_per_s``: durable single-entry appends per second, 64 concurrent writers
  each on its own session (a gateway serving many sessions); ``appends_per_s_one_session``
  is the same with all writers on one session.
- ``append_latency_ms``: one writer, one append at a time, p50/p99.
- ``follow_latency_ms``: from calling ``append`` to a ``follow`` iterator yielding it.
- ``replay_entries_per_s``: ``read`` of a 100,000-entry session in pages;
  ``fold_entries_per_s``: the same entries folded into a ``SessionState``.
- ``turn_cost_ms_p50_by_length``: one more turn (inbound message, then the owner's
  reply and ack at its epoch) on a session already holding 10, 1,000 or 100,000
  entries. Appending must not get slower as the session grows.
- ``db_bytes_by_length`` and ``bytes_per_entry``: database size as a session grows.

With both backends (``run_journal_comparison``) the report holds each backend's report
under ``backends`` and, under ``side_by_side``, the durable appends/s of the two
measured in alternating rounds (SQLite, PostgreSQL, SQLite...) with both stores open:
whatever else the machine does weighs on both alike. ``postgres_to_sqlite`` is the
ratio of their medians (target: at least ``POSTGRES_TO_SQLITE_MIN``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shadowpod.bench.machine import LOOP_STEPS, MachineProbe
from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.journal.store import JournalStore
from shadowpod.stats import summary_ms

TARGETS_SQLITE: Final = {
    "appends_per_s": 20_000,
    "follow_latency_ms_p99": 5.0,
    "replay_entries_per_s": 100_000,
    "turn_cost_growth_max": 2.0,
}
# PostgreSQL's durable appends/s against SQLite's, measured side by side (issue 28).
POSTGRES_TO_SQLITE_MIN: Final = 0.5
_TEXT: Final = "What did we decide about the deployment window for the billing service?"


@dataclass(frozen=True)
class JournalBenchConfig:
    backend: str = "sqlite"
    dsn: str = "postgresql://127.0.0.1:5432/test"
    workdir: Path | None = None
    writers: int = 64
    appends: int = 32_000
    latency_samples: int = 2_000
    follow_samples: int = 1_000
    lengths: tuple[int, ...] = (10, 1_000, 100_000)
    turns: int = 100
    rounds: int = 3
    # The machine's speed is measured before and after (see ``shadowpod.bench.machine``).
    loop_steps: int = LOOP_STEPS

    @classmethod
    def quick(cls, **overrides: Any) -> JournalBenchConfig:
        """Small sizes: proves the benchmark runs, measures nothing worth quoting."""
        values: dict[str, Any] = {
            "writers": 8,
            "appends": 400,
            "latency_samples": 50,
            "follow_samples": 30,
            "lengths": (10, 100, 1_000),
            "turns": 10,
            "rounds": 1,
            "loop_steps": 100_000,
        }
        values.update(overrides)
        return cls(**values)


def _message(n: int) -> NewEntry:
    return NewEntry(kind="message", payload={"role": "user", "content": f"{_TEXT} #{n}"})


def _reply(turn: int) -> list[NewEntry]:
    return [
        NewEntry(kind="message", payload={"role": "assistant", "content": _TEXT, "turn": turn}),
        NewEntry(kind="ack", payload={"turn": turn}),
    ]


@asynccontextmanager
async def _store(config: JournalBenchConfig) -> AsyncIterator[tuple[JournalStore, Any]]:
    """A fresh store and a function returning its size in bytes."""
    if config.backend == "sqlite":
        from shadowpod.journal.sqlite.store import SQLiteJournalStore

        workdir = Path(tempfile.mkdtemp(prefix="shadowpod-bench-", dir=config.workdir))
        store = SQLiteJournalStore(workdir / "journal.db")
        try:
            await store.open()

            async def size() -> int:
                # Checkpoint first: the WAL is scratch space that is reused, not growth.
                conn = sqlite3.connect(workdir / "journal.db")
                try:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    conn.close()
                return (workdir / "journal.db").stat().st_size

            yield store, size
        finally:
            await store.close()
            shutil.rmtree(workdir, ignore_errors=True)
    elif config.backend == "postgres":
        import psycopg

        from shadowpod.journal.postgres.store import PostgresJournalStore

        schema = f"bench_{uuid.uuid4().hex[:10]}"
        pg = PostgresJournalStore(config.dsn, schema=schema)
        await pg.open()  # a server that cannot be reached fails here, with nothing to undo

        async def pg_size() -> int:
            async with await psycopg.AsyncConnection.connect(config.dsn) as conn:
                row = await (
                    await conn.execute(
                        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = %s AND c.relkind = 'r'",
                        (schema,),
                    )
                ).fetchone()
                return int(row[0]) if row and row[0] is not None else 0

        try:
            yield pg, pg_size
        finally:
            await pg.close()
            async with await psycopg.AsyncConnection.connect(config.dsn, autocommit=True) as conn:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    else:
        raise ValueError(f"unknown backend {config.backend!r}: use sqlite or postgres")


async def _throughput(store: JournalStore, sessions: Sequence[str], total: int) -> float:
    per_writer = total // len(sessions)
    batches = [[_message(n) for n in range(per_writer)] for _ in sessions]

    async def writer(session: str, entries: list[NewEntry]) -> None:
        for entry in entries:
            await store.append(session, [entry])

    started = time.perf_counter()
    await asyncio.gather(*(writer(s, b) for s, b in zip(sessions, batches, strict=True)))
    return per_writer * len(sessions) / (time.perf_counter() - started)


async def _append_latency(store: JournalStore, session: str, samples: int) -> list[float]:
    entries = [_message(n) for n in range(samples)]
    latencies = []
    for entry in entries:
        started = time.perf_counter()
        await store.append(session, [entry])
        latencies.append(time.perf_counter() - started)
    return latencies


async def _follow_latency(store: JournalStore, session: str, samples: int) -> list[float]:
    sent: dict[int, float] = {}
    latencies: list[float] = []
    head = await store.head(session)
    done = asyncio.Event()

    async def follower() -> None:
        async for entry in store.follow(session, head):
            latencies.append(time.perf_counter() - sent[entry.seq])
            if len(latencies) == samples:
                done.set()
                return

    task = asyncio.create_task(follower())
    await asyncio.sleep(0.05)  # let the follower subscribe
    for n in range(samples):
        entry = _message(n)
        started = time.perf_counter()
        # The seq is known only after the append; the follower may see it first, so
        # record the start under the seq we will get (appends are sequential here).
        sent[head + n + 1] = started
        await store.append(session, [entry])
        await asyncio.sleep(0.001)
    await asyncio.wait_for(done.wait(), timeout=60)
    await task
    return latencies


async def _fill(store: JournalStore, session: str, count: int, *, batch: int = 500) -> None:
    """Bring a session to ``count`` entries, as turns (message, reply, ack)."""
    head = await store.head(session)
    epoch = (await store.get_ownership(session)).epoch
    while head < count:
        inbound = await store.append(session, [_message(head)])
        turn = inbound[0].seq
        outputs: list[NewEntry] = []
        while len(outputs) < batch and turn + len(outputs) + 2 <= count:
            outputs.append(
                NewEntry(
                    kind="message", payload={"role": "assistant", "content": _TEXT, "turn": turn}
                )
            )
        outputs.append(NewEntry(kind="ack", payload={"turn": turn}))
        await store.append(session, outputs, owner_epoch=epoch)
        head = await store.head(session)


async def _turn_cost(store: JournalStore, session: str, turns: int) -> list[float]:
    epoch = (await store.get_ownership(session)).epoch
    costs = []
    for n in range(turns):
        started = time.perf_counter()
        inbound = await store.append(session, [_message(n)])
        await store.append(session, _reply(inbound[0].seq), owner_epoch=epoch)
        costs.append(time.perf_counter() - started)
    return costs


async def _replay(store: JournalStore, session: str) -> tuple[float, float, int]:
    started = time.perf_counter()
    entries = []
    after = 0
    while True:
        page = await store.read(session, after, 5_000)
        if not page:
            break
        entries.extend(page)
        after = page[-1].seq
    read_rate = len(entries) / (time.perf_counter() - started)
    started = time.perf_counter()
    fold(SessionState(), entries)
    fold_rate = len(entries) / (time.perf_counter() - started)
    return read_rate, fold_rate, len(entries)


async def run_journal_bench(config: JournalBenchConfig) -> dict[str, Any]:
    machine = MachineProbe(loop_steps=config.loop_steps)
    machine.start()
    report: dict[str, Any] = {
        "benchmark": "journal",
        "backend": config.backend,
        "machine": {},
        "config": {
            "rounds": config.rounds,
            "writers": config.writers,
            "appends": config.appends,
            "lengths": list(config.lengths),
            "turns_per_length": config.turns,
        },
    }
    async with _store(config) as (store, size):
        many = [f"w{n}" for n in range(config.writers)]
        for session in [*many, "one", "latency", "follow"]:
            await store.create_session(session)
        # Throughput is the median of a few rounds: one short round is at the mercy
        # of whatever else the machine is doing.
        rounds = [await _throughput(store, many, config.appends) for _ in range(config.rounds)]
        report["appends_per_s"] = round(statistics.median(rounds))
        report["appends_per_s_rounds"] = [round(r) for r in rounds]
        rounds = [
            await _throughput(store, ["one"] * config.writers, config.appends)
            for _ in range(config.rounds)
        ]
        report["appends_per_s_one_session"] = round(statistics.median(rounds))
        report["append_latency_ms"] = summary_ms(
            await _append_latency(store, "latency", config.latency_samples)
        )
        report["follow_latency_ms"] = summary_ms(
            await _follow_latency(store, "follow", config.follow_samples)
        )

    turn_cost: dict[str, float] = {}
    db_bytes: dict[str, int] = {}
    async with _store(config) as (store, size):
        await store.create_session("turns")
        await store.compare_and_set_ownership("turns", 0, Ownership(epoch=1, owner="bench"))
        empty = await size()
        for length in config.lengths:
            await _fill(store, "turns", length)
            db_bytes[str(length)] = await size() - empty
            turn_cost[str(length)] = summary_ms(await _turn_cost(store, "turns", config.turns))[
                "p50"
            ]
        read_rate, fold_rate, replayed = await _replay(store, "turns")
        entries = await store.head("turns")
        total = await size() - empty
    report["turn_cost_ms_p50_by_length"] = turn_cost
    report["db_bytes_by_length"] = db_bytes
    report["bytes_per_entry"] = round(total / entries, 1)
    report["replay_entries"] = replayed
    report["replay_entries_per_s"] = round(read_rate)
    report["fold_entries_per_s"] = round(fold_rate)
    shortest, longest = str(config.lengths[0]), str(config.lengths[-1])
    report["turn_cost_growth"] = round(turn_cost[longest] / turn_cost[shortest], 2)
    report["machine"] = machine.report()
    if config.backend == "sqlite":
        report["targets"] = _check_targets(report)
    return report


async def run_journal_comparison(config: JournalBenchConfig) -> dict[str, Any]:
    """Both backends in one report (see the module docstring); ``config.backend`` is
    ignored."""
    machine = MachineProbe(loop_steps=config.loop_steps)
    machine.start()
    sqlite_config = dataclasses.replace(config, backend="sqlite")
    postgres_config = dataclasses.replace(config, backend="postgres")
    rates: dict[str, list[float]] = {"sqlite": [], "postgres": []}
    async with _store(sqlite_config) as (lite, _), _store(postgres_config) as (pg, _):
        stores = {"sqlite": lite, "postgres": pg}
        sessions = [f"w{n}" for n in range(config.writers)]
        for store in stores.values():
            for session in sessions:
                await store.create_session(session)
        for _ in range(config.rounds):
            for name, store in stores.items():
                rates[name].append(await _throughput(store, sessions, config.appends))
    sqlite_rate = statistics.median(rates["sqlite"])
    postgres_rate = statistics.median(rates["postgres"])
    ratio = round(postgres_rate / sqlite_rate, 2)
    side_by_side = {
        "writers": config.writers,
        "appends_per_round": config.appends,
        "sqlite_appends_per_s": round(sqlite_rate),
        "postgres_appends_per_s": round(postgres_rate),
        "sqlite_rounds": [round(r) for r in rates["sqlite"]],
        "postgres_rounds": [round(r) for r in rates["postgres"]],
        "postgres_to_sqlite": ratio,
    }
    backends = {
        "sqlite": await run_journal_bench(sqlite_config),
        "postgres": await run_journal_bench(postgres_config),
    }
    return {
        "benchmark": "journal",
        "backend": "both",
        "side_by_side": side_by_side,
        "backends": backends,
        "targets": {
            "postgres_to_sqlite_min": {
                "target": POSTGRES_TO_SQLITE_MIN,
                "measured": ratio,
                "met": ratio >= POSTGRES_TO_SQLITE_MIN,
            },
            **{f"sqlite_{k}": v for k, v in backends["sqlite"]["targets"].items()},
        },
        "machine": machine.report(),
    }


def _check_targets(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    measured = {
        "appends_per_s": report["appends_per_s"],
        "follow_latency_ms_p99": report["follow_latency_ms"]["p99"],
        "replay_entries_per_s": report["replay_entries_per_s"],
        "turn_cost_growth_max": report["turn_cost_growth"],
    }
    lower_is_better = {"follow_latency_ms_p99", "turn_cost_growth_max"}
    return {
        name: {
            "target": target,
            "measured": measured[name],
            "met": measured[name] <= target
            if name in lower_is_better
            else measured[name] >= target,
        }
        for name, target in TARGETS_SQLITE.items()
    }
