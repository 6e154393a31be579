"""``shadowpod bench``: benchmarks with figures a human can read or a tool can parse."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from rich.console import Console
from rich.table import Table

from shadowpod import eventloop
from shadowpod.bench.chaos import BOUNDARIES, ChaosConfig, run_chaos
from shadowpod.bench.criu import SIZES_MB, CriuBenchConfig, run_criu_bench
from shadowpod.bench.gate import GateBenchConfig, run_gate_bench
from shadowpod.bench.journal import (
    JournalBenchConfig,
    run_journal_bench,
    run_journal_comparison,
)
from shadowpod.bench.migrate import MigrateBenchConfig, run_migrate_bench
from shadowpod.bench.snapshot_upload import SnapshotBenchConfig, run_snapshot_bench
from shadowpod.bench.stream_fanout import MODES, FanoutBenchConfig, run_fanout_bench
from shadowpod.cli.errors import fail, interrupted
from shadowpod.cli.subject import agent_options, agent_under_test
from shadowpod.gates.policy import JudgeKind

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_PG = "postgresql://127.0.0.1:5432/test"

# The options every benchmark on a real cluster takes, with `make cluster`'s defaults.
KUBECONFIG_OPTION = click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("/var/lib/shadowpod-cluster/admin.kubeconfig"),
    show_default=True,
    help="The cluster's kubeconfig (by default `make cluster`'s).",
)
GATEWAY_HOST_OPTION = click.option(
    "--gateway-host",
    default="10.87.0.1",
    show_default=True,
    help="Where the gateway listens: an address of this machine the cluster's pods reach "
    "(`make cluster`'s API server address).",
)


@click.group()
def bench() -> None:
    """Measure Shadowpod on this machine."""


def _backend(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--backend",
        type=click.Choice(["sqlite", "postgres"]),
        default="sqlite",
        show_default=True,
        help=help_text,
    )


_dsn = click.option(
    "--dsn",
    default=lambda: os.environ.get("SHADOWPOD_PG", DEFAULT_PG),
    show_default="$SHADOWPOD_PG or " + DEFAULT_PG,
    help="PostgreSQL DSN (a throw-away schema is created and dropped).",
)


def _workdir(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=help_text,
    )


@bench.command("journal")
@click.option(
    "--backend",
    type=click.Choice(["sqlite", "postgres", "both"]),
    default="sqlite",
    show_default=True,
    help="Journal store to measure; both: the two in one report, their durable "
    "appends/s measured side by side.",
)
@_dsn
@_workdir("Where SQLite databases are created (default: the system temp dir).")
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
    run = run_journal_comparison(config) if backend == "both" else run_journal_bench(config)
    _run_and_report("journal", run, _print_journal, as_json, check)


def _print_journal(report: dict[str, Any]) -> None:
    if report["backend"] == "both":
        for backend_report in report["backends"].values():
            _print_journal(backend_report)
        side = report["side_by_side"]
        Console().print(
            f"side by side, {side['writers']} writers: SQLite {side['sqlite_appends_per_s']:,} "
            f"and PostgreSQL {side['postgres_appends_per_s']:,} durable appends/s "
            "(PostgreSQL/SQLite "
            + _against(
                report["targets"]["postgres_to_sqlite_min"],
                "[green]met[/green]",
                "[red]missed[/red]",
            )
            + ")"
        )
        Console().print(f"machine over the whole run: {_machine(report)}")
        return
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
        table.add_row(f"target {name}", _against(target, "[green]met[/green]", "[red]missed[/red]"))
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("snapshot")
@click.option("--size-mib", default=250, show_default=True, type=click.IntRange(min=1))
@click.option("--bystanders", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--compare-source",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Also measure a gateway run from this source tree (e.g. a checkout of main).",
)
@_workdir("Where the gateway's journal is created (default: the system temp dir).")
@click.option("--quick", is_flag=True, help="Tiny sizes: checks that it runs, figures mean little.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def snapshot(
    size_mib: int,
    bystanders: int,
    compare_source: Path | None,
    workdir: Path | None,
    quick: bool,
    as_json: bool,
) -> None:
    """One large snapshot PUT to a gateway: its peak RSS, other sessions' post latency."""
    options: dict[str, Any] = {"compare_source": compare_source, "workdir": workdir}
    config = (
        SnapshotBenchConfig.quick(**options)
        if quick
        else SnapshotBenchConfig(size_mib=size_mib, bystanders=bystanders, **options)
    )
    _run_and_report("snapshot", run_snapshot_bench(config), _print_snapshot, as_json, False)


def _posts(phase: str, figure: str) -> Callable[[dict[str, Any]], Any]:
    return lambda run: run["other_sessions_post_latency"][phase].get(figure)


def _print_snapshot(report: dict[str, Any]) -> None:
    table = Table(title=f"one {report['size_mib']} MiB snapshot PUT to a gateway (SQLite)")
    table.add_column("figure")
    for run in report["runs"]:
        table.add_column(run["source"], justify="right")
    rows: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("answer", lambda r: r["upload"]["status"]),
        ("upload s", lambda r: r["upload"]["seconds"]),
        ("gateway RSS resting MiB", lambda r: r["gateway_rss_mib"]["resting"]),
        ("gateway RSS peak MiB", lambda r: r["gateway_rss_mib"]["peak"]),
    ]
    for phase in ("before_upload", "during_upload"):
        for figure in ("p50_ms", "p99_ms", "max_ms", "failures"):
            rows.append((f"other posts {phase.replace('_', ' ')} {figure}", _posts(phase, figure)))
    for name, value in rows:
        table.add_row(name, *(str(value(run)) for run in report["runs"]))
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("fanout")
@click.option(
    "--streams",
    default="0,100,1000",
    show_default=True,
    help="Levels of open event streams on the session, comma-separated.",
)
@click.option("--appends", default=300, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--mode",
    "modes",
    type=click.Choice(MODES),
    multiple=True,
    help="How the streams are held (default: all three): never read; read and dropped;"
    " or read on another session, which gets no message (idle streams).",
)
@click.option(
    "--journal",
    "journal_url",
    default=None,
    help="The gateway's journal URL (default: SQLite in the workdir); postgresql://… "
    "gets a schema of its own.",
)
@click.option(
    "--compare-source",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Also measure a gateway run from this source tree (e.g. a checkout of main).",
)
@_workdir("Where the gateway's journal is created (default: the system temp dir).")
@click.option("--quick", is_flag=True, help="Tiny sizes: checks that it runs, figures mean little.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def fanout(
    streams: str,
    appends: int,
    modes: tuple[str, ...],
    journal_url: str | None,
    compare_source: Path | None,
    workdir: Path | None,
    quick: bool,
    as_json: bool,
) -> None:
    """Post latency and owner delivery with 0, 100, 1,000 event streams on the session."""
    try:
        levels = tuple(int(level) for level in streams.split(","))
    except ValueError:
        raise click.BadParameter(f"{streams!r}: use numbers, e.g. 0,100,1000") from None
    options: dict[str, Any] = {
        "modes": modes or MODES,
        "journal_url": journal_url,
        "compare_source": compare_source,
        "workdir": workdir,
    }
    config = (
        FanoutBenchConfig.quick(**options)
        if quick
        else FanoutBenchConfig(streams=levels, appends=appends, **options)
    )
    _run_and_report("fanout", run_fanout_bench(config), _print_fanout, as_json, False)


def _print_fanout(report: dict[str, Any]) -> None:
    table = Table(
        title=f"{report['appends_per_level']} posts to one session with event streams open "
        f"({report['journal']})"
    )
    for column in ("source", "streams held", "open streams", "post p50/p99 ms",
                   "owner delivery p50/p99 ms", "load average"):  # fmt: skip
        table.add_column(column)
    for run in report["runs"]:
        for level, figures in run["by_open_streams"].items():
            posts, delivery = figures["posts"], figures["owner_delivery"]
            table.add_row(
                run["source"],
                run["streams_held"],
                level,
                f"{posts.get('p50_ms')}/{posts.get('p99_ms')}",
                f"{delivery.get('p50_ms')}/{delivery.get('p99_ms')}",
                " ".join(str(x) for x in figures["load_average"]),
            )
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("migrate")
@click.option(
    "--rate",
    default=1000.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Client messages per second.",
)
@click.option("--migrations", default=20, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--sessions",
    default=MigrateBenchConfig.sessions,
    show_default=True,
    type=click.IntRange(min=1),
    help="Sessions sharing the rate; migrated in turn.",
)
@click.option(
    "--strategy",
    type=click.Choice(["shadow", "restart", "criu"]),
    default="shadow",
    show_default=True,
    help="criu: checkpoint/restore against the app-level path, by the agent's memory "
    "(needs CRIU 4 and root, see docs/criu.md).",
)
@click.option(
    "--memory-mb",
    "memory_mb",
    multiple=True,
    type=click.IntRange(min=0),
    help=f"With --strategy criu: the memory the agent holds, MB (repeat; "
    f"default {', '.join(map(str, SIZES_MB))}).",
)
@click.option(
    "--compare",
    default=3,
    show_default=True,
    type=click.IntRange(min=0),
    help="Migrations of the other strategy, for comparison (0: none).",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Short warm-up and gaps: checks that it runs, figures mean little.",
)
@click.option(
    "--warmup",
    "warmup_s",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds of load before the first migration: the history a session holds"
    " when it first moves (about rate / sessions * warmup turns).",
)
@click.option(
    "--fence-probe",
    is_flag=True,
    help="Send one more message as each fence begins: a fence pause to measure in every"
    " migration, at any rate (its reply latency is reported too).",
)
@click.option(
    "--max-backlog",
    "max_backlog_s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Give up (exit 2) once a message has waited this many seconds for its reply: "
    "the machine does not keep up with --rate.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--check", is_flag=True, help="Exit 1 when a target is missed.")
@agent_options
def migrate(
    rate: float,
    migrations: int,
    sessions: int,
    strategy: str,
    memory_mb: tuple[int, ...],
    compare: int,
    quick: bool,
    warmup_s: float,
    fence_probe: bool,
    max_backlog_s: float,
    as_json: bool,
    check: bool,
    **agent_options: Any,
) -> None:
    """Live migrations under client load: phase times, fence pause, client pause, invariants.

    Any agent: --images map.yaml --from A --to B [--relocate B2] (replies carry
    meta.version)."""
    if strategy == "criu":
        criu = CriuBenchConfig(sizes_mb=memory_mb or SIZES_MB)
        _run_and_report("CRIU migration", run_criu_bench(criu), _print_criu, as_json, check)
        return
    config = MigrateBenchConfig(
        agent=agent_under_test(**agent_options),
        rate=rate,
        migrations=migrations,
        sessions=sessions,
        strategy="restart" if strategy == "restart" else "shadow",
        compare=compare,
        warmup_s=warmup_s,
        max_backlog_s=max_backlog_s,
        fence_probe=fence_probe,
    )
    if quick:
        config = dataclasses.replace(config, warmup_s=0.5, gap_s=0.3, loop_steps=100_000)
    _run_and_report("migration", run_migrate_bench(config), _print_migrate, as_json, check)


def _print_criu(report: dict[str, Any]) -> None:
    table = Table(
        title=f"migrate benchmark — criu {report['criu']} against the app-level path, "
        f"{report['rate']:g} msg/s"
    )
    for column in ("memory", "checkpoint", "size", "restore", "total", "snapshot (state)"):
        table.add_column(column, justify="right")
    table.add_column("restore (state)", justify="right")
    table.add_column("total (state)", justify="right")
    for size in report["sizes"]:
        criu, state = size["criu"], size["state"]
        table.add_row(
            f"{size['memory_mb']} MB",
            f"{criu['checkpoint_ms']} ms",
            f"{criu['checkpoint_mb']} MB",
            f"{criu['restoring_ms']} ms",
            f"{criu['total_ms']} ms",
            f"{state['snapshotting_ms']} ms",
            f"{state['restoring_ms']} ms",
            f"{state['total_ms']} ms",
        )
    Console().print(table)


def _print_migrate(report: dict[str, Any]) -> None:
    summary = report["summary"]
    table = Table(
        title=f"migrate benchmark — {report['strategy']}, {report['rate']:g} msg/s "
        f"over {report['sessions']} sessions"
    )
    table.add_column("figure")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    for name in ("total_s", "fencing_ms", "fence_probe_reply_ms", "client_max_latency_ms"):
        if summary.get(name) is not None:
            figure = summary[name]
            table.add_row(name.replace("_", " "), str(figure["p50"]), str(figure["p99"]))
    for part, figure in (summary.get("fence_probe_breakdown_ms") or {}).items():
        if isinstance(figure, dict):
            name = f"  probe: {part.replace('_', ' ')}"
            table.add_row(name, str(figure["p50"]), str(figure["p99"]))
    if "comparison" in report:
        other = report["comparison"]
        table.add_row(
            f"client max latency ({other['strategy']})",
            str(other["summary"]["client_max_latency_ms"]["p50"]),
            str(other["summary"]["client_max_latency_ms"]["p99"]),
        )
    Console().print(table)
    facts = Table(show_header=False)
    facts.add_row("migrations succeeded", f"{summary['succeeded']} of {len(report['migrations'])}")
    facts.add_row(
        "lost / duplicated / reordered",
        f"{summary['lost']} / {summary['duplicated']} / {summary['reordered']}",
    )
    facts.add_row("catch-up replay", f"{summary['catchup_entries_per_s']} entries/s")
    if "client_pause_restart_over_shadow" in summary:
        facts.add_row(
            "client pause, restart / shadow", f"{summary['client_pause_restart_over_shadow']}x"
        )
    for name, target in report.get("targets", {}).items():
        facts.add_row(f"target {name}", _against(target, "[green]met[/green]", "[red]missed[/red]"))
    for name, goal in report.get("goals", {}).items():
        facts.add_row(
            f"goal {name}", _against(goal, "[green]reached[/green]", "[yellow]not reached[/yellow]")
        )
    Console().print(facts)
    Console().print(f"machine: {_machine(report)}")


@bench.command("gate")
@click.option("--rate", default=200.0, show_default=True, type=click.FloatRange(min=1))
@click.option("--migrations", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--turns", default=5, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--judge",
    type=click.Choice(["exact", "normalised", "tool_calls", "semantic"]),
    default="semantic",
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def gate(rate: float, migrations: int, turns: int, judge: str, as_json: bool) -> None:
    """Shadow compare's cost: client latency and migration time with and without it,
    migrations of each kind alternating in one run (``--migrations`` of each)."""
    config = GateBenchConfig(
        rate=rate,
        migrations=migrations,
        turns=turns,
        judge=cast(JudgeKind, judge),
    )
    try:
        report = eventloop.run(run_gate_bench(config), terminate_gracefully=True)
    except KeyboardInterrupt:
        interrupted()
    except Exception as exc:  # noqa: BLE001 — a benchmark that cannot run says why
        fail(f"the benchmark could not run: {exc}", 2)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for key in ("without_gate", "with_gate"):
        series = report[key]
        during = series["latency_ms_during_migrations"]
        click.echo(
            f"{key.replace('_', ' ')}: migrations {series['results']}, total p50 "
            f"{series['migration_total_s']['p50']:.3f} s; reply latency during migrations "
            f"p50 {during['p50']} ms, p99 {during['p99']} ms ({during['messages']} messages)"
        )
    gated = report["with_gate"]
    click.echo(f"lost/duplicated/reordered {list(report['invariants'].values())}")
    click.echo(
        f"p99 with / without: {report['p99_ratio_during_migrations']}; "
        f"added migration time p50: {report['added_migration_s_p50']} s; the gate's own "
        f"overhead beyond its window p50 {gated['gate_overhead_ms']['p50']} ms "
        f"(window p50 {gated['window_s']['p50']} s); the model loaded beforehand in "
        f"{report['semantic_model_load_s']} s"
    )


@bench.command("chaos")
@click.option(
    "--migrations", default=ChaosConfig.migrations, show_default=True, type=click.IntRange(min=1)
)
@click.option(
    "--seed",
    default=ChaosConfig.seed,
    show_default=True,
    type=int,
    help="Draws the victims, phases and moments: a seed gives the same campaign.",
)
@click.option(
    "--rate",
    default=ChaosConfig.rate,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Client messages per second, shared by the sessions.",
)
@click.option(
    "--sessions",
    default=ChaosConfig.sessions,
    show_default=True,
    type=click.IntRange(min=1),
    help="Sessions under load; migrated in turn.",
)
@_backend("The gateway's journal store.")
@_dsn
@_workdir("Where the run's directory is made (default: the system temp dir).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def chaos(
    migrations: int,
    seed: int,
    rate: float,
    sessions: int,
    backend: str,
    dsn: str,
    workdir: Path | None,
    as_json: bool,
) -> None:
    """Migrations under load while a random component (gateway, source, shadow, the
    engine) is killed with SIGKILL at a random phase; the invariants after each.

    Exits 1 when an invariant broke: a message lost, duplicated or reordered, or answered
    later than the bound; a session left with a dead owner; a process of a dead instance
    left running, an instance left that owns no session.
    """
    config = ChaosConfig(
        migrations=migrations,
        seed=seed,
        rate=rate,
        sessions=sessions,
        journal_url=dsn if backend == "postgres" else None,
        workdir=workdir,
    )
    _run_and_report(
        "crash campaign", run_chaos(config, _chaos_progress), _print_chaos, as_json, check=True
    )


def _chaos_progress(entry: dict[str, Any]) -> None:
    """One line per migration on stderr, as it ends: a long run can be followed."""
    keys = (
        "n", "victim", "phase", "delay_ms", "result", "lost", "duplicated", "reordered", "late",
        "worst_answer_s",
    )  # fmt: skip
    line = {key: entry[key] for key in keys}
    line |= {key: len(entry[key]) for key in ("dead_owners", "orphans", "leftovers")}
    click.echo(json.dumps(line | {"seconds": entry["seconds"]}), err=True)


def _print_chaos(report: dict[str, Any]) -> None:
    table = Table(
        title=f"crash campaign — {report['migrations_run']} migrations, {report['backend']}"
    )
    table.add_column("victim")
    for phase in BOUNDARIES:
        table.add_column(phase.value, justify="right")
    for victim, phases in report["kills"].items():
        table.add_row(victim, *(str(phases.get(phase.value, "")) for phase in BOUNDARIES))
    Console().print(table)
    facts = Table(show_header=False)
    facts.add_row(
        "succeeded / rolled back / failed",
        f"{report['succeeded']} / {report['rolled_back']} / {report['failed']}",
    )
    for name in ("lost", "duplicated", "reordered", "late", "dead_owners", "orphans", "leftovers"):
        facts.add_row(name.replace("_", " "), str(report[name]))
    facts.add_row(
        "worst answer / bound", f"{report['worst_answer_s']} s / {report['answer_bound_s']:g} s"
    )
    facts.add_row(
        "engine restarts / sources lost / replaced on their image",
        f"{report['engine_restarts']} / {report['sources_lost']} / {report['replacements']}",
    )
    facts.add_row("owners killed after their migration, restarted", str(report["owner_restarts"]))
    facts.add_row("duration", f"{report['duration_s']} s")
    for name, target in report["targets"].items():
        facts.add_row(f"target {name}", _against(target, "[green]met[/green]", "[red]missed[/red]"))
    Console().print(facts)
    Console().print(f"machine: {_machine(report)}")


def _against(target: dict[str, Any], met: str, missed: str) -> str:
    """A figure against its target; ``met`` is ``None`` when the run had no sample."""
    if target["met"] is None:
        return f"not measured (target {target['target']})"
    return f"{target['measured']} vs {target['target']} {met if target['met'] else missed}"


def _machine(report: dict[str, Any]) -> str:
    """One line on the machine the figures come from (see ``shadowpod.bench.machine``)."""
    machine = report["machine"]
    loop = machine["python_loop_s"]
    line = (
        f"{machine['cpus']} cores; a {loop['steps']:,}-step Python loop took "
        f"{loop['before']} s before and {loop['after']} s after"
    )
    if machine["cpu"] is not None:
        line += f"; cores busy {machine['cpu']['busy_pct']}%, stolen {machine['cpu']['steal_pct']}%"
    return line


@bench.command("lifecycle")
@click.option("--rounds", default=20, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/tmp/shadowpod-bench-lifecycle"),
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def lifecycle(rounds: int, workdir: Path, as_json: bool) -> None:
    """Suspend a session and wake it with a message, ROUNDS times: the waking message's
    reply latency against the new owner's cold start."""
    from shadowpod.bench.lifecycle import LifecycleBenchConfig, run_lifecycle_bench

    if workdir.exists():
        shutil.rmtree(workdir)
    config = LifecycleBenchConfig(rounds=rounds, workdir=workdir)
    _run_and_report("lifecycle", run_lifecycle_bench(config), _print_lifecycle, as_json, False)


def _print_lifecycle(report: dict[str, Any]) -> None:
    table = Table(title="suspend and wake")
    table.add_column("figure")
    table.add_column("p50 / p99 (ms)", justify="right")
    for key in ("resume_latency_ms", "owner_start_ms", "suspend_ms"):
        table.add_row(
            key.removesuffix("_ms").replace("_", " "), "{p50} / {p99}".format(**report[key])
        )
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("scale")
@click.option("--replicas", default=3, show_default=True, type=click.IntRange(min=1, max=16))
@click.option("--sessions", default=10_000, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--rate", default=2_000.0, show_default=True, type=click.FloatRange(min=0.1),
    help="Messages posted per second, in all (open loop).",
)  # fmt: skip
@click.option("--duration", default=20.0, show_default=True, type=click.FloatRange(min=1))
@click.option(
    "--lease-ttl", default=10.0, show_default=True, type=click.FloatRange(min=1, max=3600),
    help="The replicas' --lease-ttl: the takeover bound.",
)  # fmt: skip
@_dsn
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def scale(
    replicas: int,
    sessions: int,
    rate: float,
    duration: float,
    lease_ttl: float,
    dsn: str,
    as_json: bool,
) -> None:
    """Gateway replicas on one PostgreSQL journal: client latency with one replica and
    with REPLICAS, the takeover time of a killed replica's sessions, memory per replica."""
    from shadowpod.bench.scale import ScaleBenchConfig, run_scale_bench

    config = ScaleBenchConfig(
        replicas=replicas,
        sessions=sessions,
        rate=rate,
        duration_s=duration,
        lease_ttl_s=lease_ttl,
        dsn=dsn,
    )
    _run_and_report("scale", run_scale_bench(config), _print_scale, as_json, False)


def _print_scale(report: dict[str, Any]) -> None:
    table = Table(
        title=f"gateway replicas: {report['sessions']} sessions, {report['rate']:g} posts/s offered"
    )
    for column in ("replicas", "accepted/s", "p50 / p99 ms", "failed", "RSS MiB", "takeover s"):
        table.add_column(column, justify="right")
    for run in report["runs"]:
        load, takeover = run["load"], run.get("takeover")
        latency = load["latency_ms"] or {"p50": "-", "p99": "-"}
        taken = (
            "-"
            if not takeover or takeover["takeover_s"] is None
            else "{p50} / {p99} / max {max}".format(**takeover["takeover_s"])
        )
        table.add_row(
            str(run["replicas"]),
            str(load["accepted_per_s"]),
            "{p50} / {p99}".format(**latency),
            str(sum(load["failed"].values()) + load["not_sent_too_many_in_flight"]),
            " ".join(str(v) for v in run["rss_mib"].values()),
            taken,
        )
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("fork")
@click.option("--rounds", default=20, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(["sqlite", "postgres"]),
    default=("sqlite", "postgres"),
    show_default=True,
)
@click.option("--dsn", default="postgresql://127.0.0.1:5432/test", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def fork(rounds: int, backends: tuple[str, ...], dsn: str, as_json: bool) -> None:
    """Fork sessions of 10, 10,000 and 100,000 entries ROUNDS times each, against
    creating a session: a fork shares its parent's journal, so its time stays flat."""
    from shadowpod.bench.forks import ForkBenchConfig, run_fork_bench

    config = ForkBenchConfig(rounds=rounds, backends=backends, dsn=dsn)
    _run_and_report("fork", run_fork_bench(config), _print_fork, as_json, False)


def _print_fork(report: dict[str, Any]) -> None:
    table = Table(title="fork against create (store calls)")
    for column in ("backend", "entries", "fork p50 / p99 ms", "create p50 / p99 ms"):
        table.add_column(column, justify="right")
    for backend, rows in report["results"].items():
        for row in rows:
            table.add_row(
                backend,
                f"{row['entries']:,}",
                "{p50} / {p99}".format(**row["fork_ms"]),
                "{p50} / {p99}".format(**row["create_ms"]),
            )
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("cluster")
@KUBECONFIG_OPTION
@GATEWAY_HOST_OPTION
@click.option("--sessions", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--rate", default=10.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option(
    "--idle-sessions",
    default=1000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Sessions the second idle cost is measured at (their pods beyond what the nodes "
    "run stay Pending).",
)
@click.option("--window", "window_s", default=60.0, show_default=True, type=float)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/tmp/shadowpod-bench-cluster"),
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report here as each part is measured (a stopped run keeps its parts).",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=600.0,
    show_default=True,
    type=float,
    help="Seconds to wait for every session Running (and every owner pod made).",
)
@click.option(
    "--parts",
    default="idle,image-change,idle-many",
    show_default=True,
    help="What is measured after the sessions are made, comma-separated: idle (the idle "
    "cost at --sessions), image-change, idle-many (the idle cost at --idle-sessions).",
)
@click.option(
    "--bump-image",
    help="The image the sessions are changed to: by default one no node has (the moves "
    "fail at the shadow's pull; the operator's reaction alone is measured); "
    "shadowpod-refagent:v2 moves them live, and the moves' times are measured too.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def cluster(
    kubeconfig: Path,
    gateway_host: str,
    sessions: int,
    rate: float,
    idle_sessions: int,
    window_s: float,
    workdir: Path,
    out: Path | None,
    timeout_s: float,
    parts: str,
    bump_image: str | None,
    as_json: bool,
) -> None:
    """The operator on a real API server with real kubelets: create → owner Pod and →
    Running, image change → AgentMigration (p50/p99), and the API requests a second
    idle sessions cost, from the API server's apiserver_request_total."""
    from shadowpod.bench.cluster import PARTS, ClusterBenchConfig, run_cluster_bench

    chosen = frozenset(p.strip() for p in parts.split(",") if p.strip())
    if unknown := chosen - PARTS:
        raise click.BadParameter(
            f"no part {', '.join(sorted(unknown))}: choose from {', '.join(sorted(PARTS))}",
            param_hint="--parts",
        )

    config = ClusterBenchConfig(
        kubeconfig=kubeconfig,
        gateway_host=gateway_host,
        sessions=sessions,
        rate=rate,
        idle_sessions=idle_sessions,
        window_s=window_s,
        workdir=workdir,
        out=out,
        timeout_s=timeout_s,
        parts=chosen,
    )
    if bump_image:
        config = dataclasses.replace(config, bump_image=bump_image)
    _run_and_report("cluster", run_cluster_bench(config), _print_cluster, as_json, False)


def _print_cluster(report: dict[str, Any]) -> None:
    table = Table(title="operator on a real cluster")
    table.add_column("figure")
    table.add_column("value", justify="right")
    reaction = report["reaction"]
    for name in (
        "create_to_owner_pod_s",
        "create_to_running_s",
        "create_to_running_by_ready_condition_s",
        "image_change_to_migration_s",
        "migration_s",
        "image_change_to_succeeded_s",
        "fencing_ms",
    ):
        if name not in reaction:
            continue
        figure = reaction[name]
        table.add_row(
            name.replace("_", " ") + " p50 / p99",
            f"{figure['p50']} / {figure['p99']} (n={figure['n']})",
        )
    for idle in report["idle"]:
        table.add_row(
            f"API requests/s for {idle['sessions']} idle sessions (per session)",
            f"{idle['operator_requests_per_s']} ({idle['operator_requests_per_s_per_session']})",
        )
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("rollout")
@KUBECONFIG_OPTION
@click.option("--sessions", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--nodes",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="Hollow nodes the sessions' pods are placed on (their agents run in this process).",
)
@click.option(
    "--probes",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="Sessions under client load, whose latency is measured before and during.",
)
@click.option("--rate", default=1.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--create-rate", default=20.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--window", "window_s", default=30.0, show_default=True, type=float)
@click.option(
    "--up-timeout",
    "up_timeout_s",
    default=1800.0,
    show_default=True,
    type=float,
    help="Seconds for every session to be Running before the bump.",
)
@click.option("--timeout", "timeout_s", default=1800.0, show_default=True, type=float)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/tmp/shadowpod-bench-rollout"),
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report here as each part is measured (a stopped run keeps its parts).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def rollout(
    kubeconfig: Path,
    sessions: int,
    nodes: int,
    probes: int,
    rate: float,
    create_rate: float,
    window_s: float,
    up_timeout_s: float,
    timeout_s: float,
    workdir: Path,
    out: Path | None,
    as_json: bool,
) -> None:
    """A fleet upgrade on a real control plane: SESSIONS following one AgentDeployment,
    their pods on hollow nodes whose agents run in this process, its image bumped under
    the default caps; wall time, migrations in flight over time against the caps,
    operator RSS and CPU, API requests/s, client latency p99 during the rollout against
    before it. Exit 1 if the rollout did not complete, the caps were exceeded or a
    message was lost, doubled or reordered."""
    from shadowpod.bench.rollout import RolloutBenchConfig, run_rollout_bench

    config = RolloutBenchConfig(
        kubeconfig=kubeconfig,
        sessions=sessions,
        nodes=nodes,
        probes=probes,
        rate=rate,
        create_rate=create_rate,
        window_s=window_s,
        up_timeout_s=up_timeout_s,
        timeout_s=timeout_s,
        workdir=workdir,
        out=out,
    )
    _run_and_report("rollout", run_rollout_bench(config), _print_rollout, as_json, True)


def _print_rollout(report: dict[str, Any]) -> None:
    if "rollout" not in report:
        Console().print(f"no rollout measured: {report.get('fleet')}")
        return
    table = Table(title=f"fleet rollout of {report['config']['sessions']} sessions")
    table.add_column("figure")
    table.add_column("before", justify="right")
    table.add_column("during", justify="right")
    before, during, client = report["before"], report["rollout"], report["client"]
    table.add_row("wall time (s)", "", f"{during['wall_s']} ({during['phase']})")
    table.add_row(
        "migrations in flight, most (per node)",
        "",
        f"{during['in_flight_most']} ({during['in_flight_most_per_node']})",
    )
    for label, key in (
        ("operator RSS (MB)", "operator_rss_mb"),
        ("operator CPU (%)", "operator_cpu_percent"),
        ("operator API requests/s", "operator_api_requests_per_s"),
        ("API server requests/s (all clients)", "apiserver_requests_per_s_all_clients"),
    ):
        table.add_row(label, str(before[key]), str(during[key]))
    table.add_row(
        "client latency p99 (s)",
        str(client["latency_before_s"]["p99"]),
        str(client["latency_during_s"]["p99"]),
    )
    table.add_row(
        "lost / duplicated / reordered",
        "",
        f"{client['lost']} / {client['duplicated']} / {client['reordered']}",
    )
    Console().print(table)
    Console().print(f"machine: {_machine(report)}")


@bench.command("cluster-scale")
@KUBECONFIG_OPTION
@click.option(
    "--steps",
    default="100,1000,10000",
    show_default=True,
    help="Session counts (comma-separated, increasing) at which the idle cost is measured.",
)
@click.option("--rate", default=40.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--bumped", default=100, show_default=True, type=click.IntRange(min=0))
@click.option("--bump-rate", default=10.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option(
    "--bump-at",
    default="1000",
    show_default=True,
    help="Steps after which --bumped sessions have their image changed (and after the "
    "last step reached, always).",
)
@click.option("--window", "window_s", default=60.0, show_default=True, type=float)
@click.option(
    "--budget",
    "budget_s",
    default=1200.0,
    show_default=True,
    type=float,
    help="Seconds after which no new step starts (the shared cluster's hold).",
)
@click.option("--reconcile-interval", default=30.0, show_default=True, type=float)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/tmp/shadowpod-bench-cluster-scale"),
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report here as each step is measured (a stopped run keeps its steps).",
)
@click.option(
    "--no-cleanup",
    is_flag=True,
    help="Leave the sessions made (for a cluster taken down after the run).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def cluster_scale(
    kubeconfig: Path,
    steps: str,
    rate: float,
    bumped: int,
    bump_rate: float,
    bump_at: str,
    window_s: float,
    budget_s: float,
    reconcile_interval: float,
    workdir: Path,
    out: Path | None,
    no_cleanup: bool,
    as_json: bool,
) -> None:
    """The operator's cost at rest as sessions grow, on a real control plane (pods on a
    hollow node): its API and gateway requests a second and its RSS at each step, and
    image change → AgentMigration (p50/p99)."""
    from shadowpod.bench.cluster_scale import ScaleBenchConfig, run_scale_bench

    counts = _counts(steps, "--steps")
    if list(counts) != sorted(set(counts)):
        raise click.BadParameter(
            "give increasing session counts, e.g. 100,1000", param_hint="--steps"
        )
    config = ScaleBenchConfig(
        kubeconfig=kubeconfig,
        steps=counts,
        rate=rate,
        bumped=bumped,
        bump_rate=bump_rate,
        bump_at=frozenset(_counts(bump_at, "--bump-at")),
        window_s=window_s,
        budget_s=budget_s,
        reconcile_interval_s=reconcile_interval,
        workdir=workdir,
        out=out,
        cleanup=not no_cleanup,
    )
    _run_and_report("cluster-scale", run_scale_bench(config), _print_cluster_scale, as_json, False)


def _counts(text: str, option: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a list of numbers, e.g. 100,1000", param_hint=option
        ) from None
    if any(c < 1 for c in counts):
        raise click.BadParameter("every count is at least 1", param_hint=option)
    return counts


def _print_cluster_scale(report: dict[str, Any]) -> None:
    table = Table(title="operator at rest, by sessions (real control plane, hollow node)")
    for column in ("sessions", "running", "operator → API /s", "→ gateway /s", "operator RSS MB"):
        table.add_column(column, justify="right")
    for step in report["steps"]:
        idle = step["idle"]
        rss = (idle["rss_mb"].get("operator") or {}).get("rss")
        table.add_row(
            f"{step['sessions']:,}",
            f"{step['running']:,}",
            str(idle["operator_api_requests_per_s"]),
            str(idle["operator_gateway_requests_per_s"]),
            str(rss),
        )
    Console().print(table)
    for bump in report["bumps"]:
        figure = bump["image_change_to_migration_s"]
        Console().print(
            f"image change → AgentMigration at {bump['sessions']:,} sessions: "
            f"p50 {figure['p50']} s, p99 {figure['p99']} s (n={figure['n']})"
        )
    Console().print(f"machine: {_machine(report)}")


@bench.command("langgraph")
@click.option(
    "--turns",
    "lengths",
    default="10,1000,10000",
    show_default=True,
    help="Conversation lengths (comma-separated) at which one more turn is measured.",
)
@click.option("--samples", default=5, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--sqlite-max-turns",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Longest conversation driven with LangGraph's SQLite saver (its file grows "
    "with the square of the turns).",
)
@click.option(
    "--tool-max-turns",
    default=None,
    type=click.IntRange(min=1),
    help="Longest conversation of tool-calling turns (default: --sqlite-max-turns).",
)
@click.option(
    "--tool-columns",
    default=None,
    help="The tool-calling columns to run, comma-separated (default: all of "
    "shadowpod_create_react_agent, shadowpod_create_agent, shadowpod_custom_graph, "
    "langgraph_sqlite_delta_channel).",
)
@_workdir("Where the SQLite files are created (default: the system temp dir).")
@click.option("--quick", is_flag=True, help="10 and 100 turns: checks that it runs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--check", is_flag=True, help="Exit 1 when a target is missed.")
def langgraph(
    lengths: str,
    samples: int,
    sqlite_max_turns: int,
    tool_max_turns: int | None,
    tool_columns: str | None,
    workdir: Path | None,
    quick: bool,
    as_json: bool,
    check: bool,
) -> None:
    """A LangGraph agent with LangGraph's SQLite saver and with Shadowpod's checkpointer:
    one more turn (ms, bytes) as the conversation grows. Needs the langgraph extra."""
    try:
        from shadowpod.bench.langgraph import (
            TOOL_COLUMNS,
            LangGraphBenchConfig,
            run_langgraph_bench,
        )
    except ImportError as exc:
        fail(f"{exc}: install the extra, pip install 'shadowpod[langgraph]'", 2)
    try:
        turns = tuple(int(n) for n in ("10,100" if quick else lengths).split(","))
    except ValueError:
        fail(f"--turns {lengths!r}: give comma-separated whole numbers, e.g. 10,1000", 2)
    if min(turns) < 1:
        fail("--turns: every length is at least 1", 2)
    known = [name for name, _, _ in TOOL_COLUMNS]
    columns = tuple(known if tool_columns is None else tool_columns.split(","))
    if not columns or any(name not in known for name in columns):
        fail(f"--tool-columns {tool_columns!r}: name some of {', '.join(known)}", 2)
    config = LangGraphBenchConfig(
        lengths=turns,
        samples=samples,
        sqlite_max_turns=max(turns) if quick else sqlite_max_turns,
        tool_max_turns=max(turns) if quick else (tool_max_turns or sqlite_max_turns),
        tool_columns=columns,
        workdir=workdir,
    )
    _run_and_report("langgraph", run_langgraph_bench(config), _print_langgraph, as_json, check)


def _print_langgraph(report: dict[str, Any]) -> None:
    table = Table(title="LangGraph checkpointers — one more turn as the conversation grows")
    table.add_column("turns", justify="right")
    for label in ("Shadowpod", "SqliteSaver"):
        table.add_column(f"{label}\nturn ms", justify="right")
        table.add_column(f"{label}\nsaver ms", justify="right")
        table.add_column(f"{label}\nbytes/turn", justify="right")
        table.add_column(f"{label}\nstored", justify="right")
    savers = report["savers"]
    for length in savers["shadowpod"]["by_turns"]:
        row = [f"{int(length):,}"]
        for saver in ("shadowpod", "langgraph_sqlite"):
            found = savers[saver]["by_turns"].get(length)
            row += (
                ["not run"] * 4
                if found is None
                else [
                    str(found["one_more_turn_ms_p50"]),
                    str(found["checkpointer_ms_p50"]),
                    f"{found['one_more_turn_bytes']:,}",
                    f"{found['bytes_stored']:,}",
                ]
            )
        table.add_row(*row)
    Console().print(table)
    tools = Table(title="Tool-calling turns — bytes one more turn writes (and turn ms)")
    tools.add_column("turns", justify="right")
    columns = report.get("tool_turns", {})
    for name in columns:
        tools.add_column(name.replace("_", " "), justify="right")
    lengths = sorted({n for c in columns.values() for n in c["by_turns"]}, key=int)
    for length in lengths:
        cells = [f"{int(length):,}"]
        for column in columns.values():
            found = column["by_turns"].get(length)
            cells.append(
                "not run"
                if found is None
                else f"{found['one_more_turn_bytes']:,} ({found['one_more_turn_ms_p50']} ms)"
            )
        tools.add_row(*cells)
    if columns:
        Console().print(tools)
    for name, target in report["targets"].items():
        Console().print(
            f"target {name}: {_against(target, '[green]met[/green]', '[red]missed[/red]')}"
        )
    Console().print(f"machine: {_machine(report)}")


def _run_and_report(
    what: str,
    bench_run: Coroutine[Any, Any, dict[str, Any]],
    print_table: Callable[[dict[str, Any]], None],
    as_json: bool,
    check: bool,
) -> None:
    """Run a benchmark; print its report; exit 2 if it cannot run, 1 on a missed target
    when asked to check."""
    try:
        report = eventloop.run(bench_run, terminate_gracefully=True)
    except KeyboardInterrupt:
        interrupted()
    except Exception as exc:  # noqa: BLE001 — a benchmark that cannot run says why, briefly
        fail(f"the {what} benchmark could not run: {str(exc) or type(exc).__name__}", 2)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_table(report)
    # A target with no sample (``met`` None) was not missed: nothing exceeded it.
    missed = [name for name, t in report.get("targets", {}).items() if t["met"] is False]
    if check and missed:
        click.echo(f"targets missed: {', '.join(missed)}", err=True)
        sys.exit(1)
