"""``shadowpod demo``: a real live migration on this machine, no cluster needed.

A gateway (SQLite in a temporary directory) and the reference agent v1 (or any agent:
``--images map.yaml --from A --to B``, see ``shadowpod.cli.subject``) serve one
session under steady client load; mid-stream the session moves to v2 through the
ShadowPod + ExchangeFence engine while the load goes on. Then the demo prints the
timeline, the fence pause, the client's figures and the invariants — and exits
non-zero if any invariant broke.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from click.core import ParameterSource
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shadowpod import eventloop
from shadowpod.cli.errors import fail, interrupted, writable_workdir
from shadowpod.cli.subject import agent_options, agent_under_test
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.local.checks import Check, replies_kept_up
from shadowpod.local.gate_demo import GateAttempt, run_gate_demo
from shadowpod.local.scenario import LiveScenario, ScenarioReport
from shadowpod.local.subject import AgentUnderTest

# --quick: enough load on each side of the move for every check to have something to judge,
# at a rate any machine running it keeps up with (it is a smoke test, not a figure: at
# 200 msg/s a 2-core machine busy with other work fell behind and the run failed).
QUICK_S = 1.5
QUICK_RATE = 50.0
PHASE_STYLE = {Phase.SUCCEEDED: "green", Phase.ROLLED_BACK: "yellow", Phase.FAILED: "red"}


class Progress:
    """What the live display shows while the demo runs."""

    def __init__(self, source: str = "refagent:v1") -> None:
        self.started = time.monotonic()
        self.step = f"starting the gateway and {source}"
        self.phase: Phase | None = None
        self.scenario: LiveScenario | None = None

    def on_phase(self, record: MigrationRecord) -> None:
        self.phase = record.phase

    def render(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("elapsed", f"{time.monotonic() - self.started:5.1f}s")
        table.add_row("step", self.step)
        if self.phase is not None:
            table.add_row(
                "migration", Text(self.phase.value, style=PHASE_STYLE.get(self.phase, "cyan"))
            )
        load = self.scenario.load if self.scenario is not None else None
        if load is not None:
            answered = sum(1 for s in load.sent if s.seq is not None and s.seq in load.replies)
            versions: dict[str, int] = {}
            for s in load.sent:
                if s.seq is not None and s.seq in load.replies:
                    version = load.replies[s.seq][0].version
                    versions[version] = versions.get(version, 0) + 1
            table.add_row("messages", f"{len(load.sent)} sent, {answered} answered")
            table.add_row(
                "answered by", ", ".join(f"v{v}: {n}" for v, n in sorted(versions.items())) or "-"
            )
        return table


async def _run(
    agent: AgentUnderTest,
    rate: float,
    before_s: float,
    after_s: float,
    workdir: Path,
    progress: Progress,
    max_p99_s: float,
) -> ScenarioReport:
    async with LiveScenario(
        workdir, rate=rate, on_phase=progress.on_phase, agent=agent
    ) as scenario:
        progress.scenario = scenario
        progress.step = f"{agent.source} serving {rate:g} msg/s"
        await asyncio.sleep(before_s)
        progress.step = f"migrating to {agent.target} while serving"
        await scenario.migrate(agent.target)
        progress.step = f"{agent.target} serving {rate:g} msg/s"
        await asyncio.sleep(after_s)
        progress.step = "stopping the load, waiting for every reply"
        report = await scenario.finish()
        report.checks.append(replies_kept_up(scenario.load, max_p99_s=max_p99_s))
        return report


async def _with_live(
    agent: AgentUnderTest,
    rate: float,
    before_s: float,
    after_s: float,
    workdir: Path,
    console: Console,
    max_p99_s: float,
) -> ScenarioReport:
    progress = Progress(agent.source)
    with Live(progress.render(), console=console, refresh_per_second=8, transient=True) as live:

        async def refresh() -> None:
            while True:
                live.update(progress.render())
                await asyncio.sleep(0.125)

        ticker = asyncio.create_task(refresh())
        try:
            return await _run(agent, rate, before_s, after_s, workdir, progress, max_p99_s)
        finally:
            ticker.cancel()


def report_json(report: ScenarioReport, rate: float) -> dict[str, Any]:
    v = report.verdict
    return {
        "rate": rate,
        "ok": report.ok,
        "migrations": [m.summary() for m in report.migrations],
        "messages": {
            "sent": v.sent,
            "accepted": v.accepted,
            "answered": v.replied,
            "by_version": v.versions,
        },
        "latency_ms": v.latency_ms,
        "invariants": {"lost": v.lost, "duplicated": v.duplicated, "reordered": v.reordered},
        "checks": [
            {"name": c.name, "ok": c.ok, "measured": c.measured, "detail": c.detail}
            for c in report.checks
        ],
    }


def print_report(report: ScenarioReport, rate: float, console: Console) -> None:
    for outcome in report.migrations:
        record = outcome.record
        timeline = Table(title=f"migration {record.spec.source.image} → {record.spec.target.image}")
        timeline.add_column("phase")
        timeline.add_column("duration", justify="right")
        for phase, seconds in record.phase_seconds().items():
            timeline.add_row(str(phase), f"{seconds * 1000:.1f} ms")
        total = record.total_s or 0.0
        timeline.add_row(Text("total", style="bold"), Text(f"{total * 1000:.1f} ms", style="bold"))
        timeline.add_row(
            "result", Text(record.phase.value, style=PHASE_STYLE.get(record.phase, ""))
        )
        console.print(timeline)
        facts = Table(show_header=False)
        facts.add_row(
            "fence pause (first buffered message)",
            _ms(record.fence_pause_ms)
            if record.fence_pause_ms is not None or record.phase is not Phase.SUCCEEDED
            else "none: no message arrived while delivery was held",
        )
        facts.add_row(
            "fence wait for the source to go idle",
            _ms(record.fence.waited_ms if record.fence else None),
        )
        facts.add_row(
            "catch-up replay",
            f"{record.catchup_entries or 0} entries at {record.catchup_entries_per_s or 0:,.0f}/s",
        )
        facts.add_row("client max latency during the migration", _ms(outcome.client_max_latency_ms))
        console.print(facts)
    v = report.verdict
    messages = Table(title="client side")
    messages.add_column("figure")
    messages.add_column("value", justify="right")
    messages.add_row("rate", f"{rate:g} msg/s")
    messages.add_row("sent / accepted / answered", f"{v.sent} / {v.accepted} / {v.replied}")
    messages.add_row("answered by", ", ".join(f"v{k}: {n}" for k, n in sorted(v.versions.items())))
    messages.add_row(
        "latency p50 / p99 / max",
        f"{v.latency_ms['p50']} / {v.latency_ms['p99']} / {v.latency_ms['max']} ms",
    )
    console.print(messages)
    checks = Table(title="invariants")
    checks.add_column("invariant")
    checks.add_column("", justify="center")
    checks.add_column("detail")
    for check in report.checks:
        checks.add_row(check.name, _verdict(check), check.detail)
    console.print(checks)
    broken = [check for check in report.checks if not check.ok]
    if not broken:
        console.print(Text("all invariants hold, and replies kept up", style="bold green"))
        return
    lines = [Text(f"BROKEN: {check.name}: {check.detail}", style="bold red") for check in broken]
    console.print(Group(*lines))


def _verdict(check: Check) -> Text:
    if not check.ok:
        return Text("BROKEN", style="bold red")
    # Nothing to judge by in this run (see shadowpod.local.checks): not a pass either.
    return Text("ok", style="green") if check.measured else Text("n/a", style="yellow")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} ms"


@click.command("demo")
@click.option(
    "--rate",
    default=200.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Client messages per second.",
)
@click.option(
    "--before",
    "before_s",
    default=4.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds of load before migrating.",
)
@click.option(
    "--after",
    "after_s",
    default=4.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds of load after migrating.",
)
@click.option(
    "--max-p99",
    "max_p99_s",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds within which 99% of replies must come: an agent slower than --rate fails.",
)
@click.option(
    "--quick",
    is_flag=True,
    help=f"A short run: {QUICK_S:g} s of load before and after the move, at "
    f"{QUICK_RATE:g} msg/s unless --rate says otherwise (a smoke test).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the gateway, agents and logs here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--gate",
    is_flag=True,
    help="Upgrade gates instead: a regressing upgrade rejected, a reworded one accepted.",
)
@agent_options
def demo(
    rate: float,
    before_s: float,
    after_s: float,
    max_p99_s: float,
    quick: bool,
    workdir: Path | None,
    as_json: bool,
    gate: bool,
    **agent_options: Any,
) -> None:
    """Run a live migration of an agent session (v1 → v2) under load, on this machine.

    Any agent: --images map.yaml --from A --to B (its replies must carry meta.version).

    With --gate: two upgrades of a v2 session under shadow compare, one that forgets the
    user's name (rolled back) and one merely reworded (accepted).

    The verdict includes the client's latency: replies slower than --max-p99 (the agent
    cannot keep up with --rate) fail the run, saying the rate it sustained.

    Exits 0 when every invariant holds and replies kept up, 1 when not, 2 when the demo
    could not run.
    """
    agent = agent_under_test(**agent_options, heartbeat_s=1.0)
    if quick:
        before_s, after_s = QUICK_S, QUICK_S
        if click.get_current_context().get_parameter_source("rate") is ParameterSource.DEFAULT:
            rate = QUICK_RATE
    console = Console(stderr=as_json)
    keep = workdir is not None
    work = _fresh_workdir(workdir) if workdir else Path(tempfile.mkdtemp(prefix="shadowpod-demo-"))
    if gate:
        _gate_demo(work, keep, as_json, console)
    try:
        if as_json:
            report = eventloop.run(
                _run(agent, rate, before_s, after_s, work, Progress(agent.source), max_p99_s),
                terminate_gracefully=True,
            )
        else:
            report = eventloop.run(
                _with_live(agent, rate, before_s, after_s, work, console, max_p99_s),
                terminate_gracefully=True,
            )
    except KeyboardInterrupt:
        interrupted()
    except Exception as exc:  # noqa: BLE001 — a demo that cannot run says why, briefly
        _could_not_run(exc, work, keep)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if as_json:
        click.echo(json.dumps(report_json(report, rate), indent=2))
    else:
        print_report(report, rate, console)
    sys.exit(0 if report.ok else 1)


def _could_not_run(exc: Exception, work: Path, keep: bool) -> NoReturn:
    logs = f"logs in {work}" if keep else "run it with --workdir DIR to keep its logs"
    fail(f"the demo could not run: {exc} ({logs})", 2)


def _gate_demo(work: Path, keep: bool, as_json: bool, console: Console) -> None:
    try:
        with console.status("two upgrades under shadow compare, a client talking throughout"):
            attempts = eventloop.run(run_gate_demo(work), terminate_gracefully=True)
    except KeyboardInterrupt:
        interrupted()
    except Exception as exc:  # noqa: BLE001 — a demo that cannot run says why, briefly
        _could_not_run(exc, work, keep)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    rejected, accepted = attempts
    ok = (
        rejected.record.phase is Phase.ROLLED_BACK
        and rejected.record.reason == "ValidationFailed"
        and accepted.record.phase is Phase.SUCCEEDED
        and all(a.lost == 0 and a.duplicated == 0 for a in attempts)
    )
    if as_json:
        click.echo(json.dumps({"ok": ok, "upgrades": [_gate_json(a) for a in attempts]}, indent=2))
    else:
        for attempt, expected in ((rejected, "rejected"), (accepted, "accepted")):
            _print_gate(attempt, expected, console)
        console.print(
            Text(
                "the regressing upgrade was rejected, the reworded one accepted, nothing lost"
                if ok
                else "UPGRADE GATES DID NOT BEHAVE AS EXPECTED",
                style="bold green" if ok else "bold red",
            )
        )
    sys.exit(0 if ok else 1)


def _gate_json(attempt: GateAttempt) -> dict[str, Any]:
    record = attempt.record
    return {
        "target": record.spec.target.image,
        "result": record.phase.value,
        "reason": record.reason,
        "validation": record.validation.model_dump() if record.validation else None,
        "sent": len(attempt.sent),
        "lost": attempt.lost,
        "duplicated": attempt.duplicated,
        "then_answered": {"by": attempt.last_by, "reply": attempt.last_reply},
    }


def _print_gate(attempt: GateAttempt, expected: str, console: Console) -> None:
    record = attempt.record
    summary = record.validation
    table = Table(title=f"upgrade {record.spec.source.image} → {record.spec.target.image}")
    table.add_column("")
    table.add_column("", overflow="fold")
    table.add_row(
        "result",
        Text(
            f"{record.phase.value}" + (f" ({record.reason})" if record.reason else ""),
            style=PHASE_STYLE.get(record.phase, ""),
        ),
    )
    if summary is not None:
        table.add_row(
            "shadow compare",
            f"{summary.agreed}/{summary.compared} live turns agree ({summary.agreement:.0%}) "
            f"by the {summary.judge} judge; {summary.threshold:.0%} needed",
        )
        for worst in summary.worst[:2]:
            table.add_row("disagreement", worst)
    table.add_row(
        "client", f"{len(attempt.sent)} sent, {attempt.lost} lost, {attempt.duplicated} twice"
    )
    table.add_row("then answered by", f"{attempt.last_by}: {attempt.last_reply}")
    console.print(table)


def _fresh_workdir(workdir: Path) -> Path:
    """``--workdir``, created if need be; refused if it holds anything already (an
    earlier run's journal would hold its session: the demo starts from nothing)."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        used = any(workdir.iterdir())
    except OSError as exc:
        fail(f"cannot use --workdir {workdir}: {exc.strerror or exc}", 2)
    if used:
        fail(
            f"--workdir {workdir} is not empty (an earlier run's journal and logs?): give a new "
            "or empty directory, or remove this one",
            2,
        )
    writable_workdir(workdir)
    return workdir
