"""``shadowpod bench``: benchmarks with figures a human can read or a tool can parse."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from shadowpod.bench.journal import JournalBenchConfig, run_journal_bench

DEFAULT_PG = "postgresql://127.0.0.1:5432/test"


@click.group()
def bench() -> None:
    """Measure Shadowpod on this machine."""


@bench.command("journal")
@click.option(
    "--backend",
    type=click.Choice(["sqlite", "postgres"]),
    default="sqlite",
    show_default=True,
    help="Journal store to measure.",
)
@click.option(
    "--dsn",
    default=lambda: os.environ.get("SHADOWPOD_PG", DEFAULT_PG),
    show_default="$SHADOWPOD_PG or " + DEFAULT_PG,
    help="PostgreSQL DSN (a throw-away schema is created and dropped).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where SQLite databases are created (default: the system temp dir).",
)
@click.option("--quick", is_flag=True, help="Tiny sizes: checks that it runs, figures mean little.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--check", is_flag=True, help="Exit 1 when a target is missed.")
def journal(
    backend: str, dsn: str, workdir: Path | None, quick: bool, as_json: bool, check: bool
) -> None:
    """Appends/s, append and follow latency, replay rate, cost per turn as sessions grow."""
    config = (
        JournalBenchConfig.quick(backend=backend, dsn=dsn, workdir=workdir)
        if quick
        else JournalBenchConfig(backend=backend, dsn=dsn, workdir=workdir)
    )
    try:
        report = asyncio.run(run_journal_bench(config))
    except Exception as exc:  # noqa: BLE001 — a benchmark that cannot run says why, briefly
        click.echo(f"error: the journal benchmark could not run: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_journal(report)
    missed = [name for name, t in report.get("targets", {}).items() if not t["met"]]
    if check and missed:
        click.echo(f"targets missed: {', '.join(missed)}", err=True)
        sys.exit(1)


def _print_journal(report: dict[str, Any]) -> None:
    table = Table(title=f"journal benchmark — {report['backend']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("durable appends/s (64 writers, 64 sessions)", f"{report['appends_per_s']:,}")
    table.add_row(
        "durable appends/s (64 writers, one session)", f"{report['appends_per_s_one_session']:,}"
    )
    for name in ("append_latency_ms", "follow_latency_ms"):
        table.add_row(name.replace("_", " ") + " p50 / p99", "{p50} / {p99}".format(**report[name]))
    table.add_row("replay entries/s", f"{report['replay_entries_per_s']:,}")
    table.add_row("fold entries/s", f"{report['fold_entries_per_s']:,}")
    for length, cost in report["turn_cost_ms_p50_by_length"].items():
        table.add_row(f"turn cost p50 at {int(length):,} entries (ms)", str(cost))
    for length, size in report["db_bytes_by_length"].items():
        table.add_row(f"database bytes at {int(length):,} entries", f"{size:,}")
    table.add_row("bytes per entry", str(report["bytes_per_entry"]))
    for name, target in report.get("targets", {}).items():
        verdict = "[green]met[/green]" if target["met"] else "[red]missed[/red]"
        table.add_row(f"target {name}", f"{target['measured']} vs {target['target']} {verdict}")
    Console().print(table)
