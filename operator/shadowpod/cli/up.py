"""``shadowpod up``, ``shadowpod migrate``, ``shadowpod status``: a local deployment that
keeps running, and live migrations of it on demand.

``up`` starts a gateway and one session's agent in ``--workdir`` and serves until
Ctrl-C or SIGTERM, then stops every process it started. ``migrate`` asks it for a
live migration of the session to another image and shows the phases as they pass;
``status`` says what runs there. See ``shadowpod.local.standing``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shadowpod import eventloop
from shadowpod.cli.errors import fail, writable_workdir
from shadowpod.engine.ports import ImageNotFound
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.local.images import ImageMap, reference_images
from shadowpod.local.standing import StandingDeployment, deployment_file
from shadowpod.local.standing_client import (
    DeploymentRefused,
    DeploymentUnreachable,
    StandingClient,
)

PHASE_STYLE = {Phase.SUCCEEDED: "green", Phase.ROLLED_BACK: "yellow", Phase.FAILED: "red"}
POLL_S = 0.05

workdir_option = click.option(
    "--workdir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The deployment's directory (gateway, journal, agents' logs, its socket).",
)


@click.command("up")
@workdir_option
@click.option(
    "--images",
    "images_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="An image map (YAML) of the agent; default: the reference agent's.",
)
@click.option(
    "--image", default="refagent:v1", show_default=True, help="The image the session starts on."
)
@click.option("--session", default="main", show_default=True, help="The session's name.")
@click.option("--port", type=click.IntRange(1, 65535), help="The gateway's port (default: free).")
def up(workdir: Path, images_path: Path | None, image: str, session: str, port: int | None) -> None:
    """Start a gateway and an agent session in --workdir, and keep them serving.

    Prints the session's URL and how to talk to it. `shadowpod migrate --workdir W --to
    IMAGE` moves it live to another image. Ctrl-C or SIGTERM stops every process it
    started (exit 0); exit 2 when it cannot start.
    """
    try:
        images = ImageMap.load(images_path) if images_path else reference_images()
        images.resolve(image)
    except (ValueError, ImageNotFound) as exc:
        fail(str(exc), 2)
    _fresh(workdir)
    try:
        eventloop.run(_up(workdir, images, image, session, port), terminate_gracefully=True)
    except (KeyboardInterrupt, eventloop.Terminated):
        pass
    except Exception as exc:  # noqa: BLE001 — cannot start: say why in one line
        fail(f"could not start: {exc} (logs in {workdir})", 2)
    click.echo("stopped: every process it started was stopped", err=True)


async def _up(workdir: Path, images: ImageMap, image: str, session: str, port: int | None) -> None:
    standing = StandingDeployment(workdir, images, port=port)
    try:
        started = await standing.start(session, image)
        facts = standing.status()
        url = facts["sessions"][0]["url"]
        w = workdir
        click.echo(
            f"session {session!r} serving on {image} (instance {started.owner.name})\n"
            f"  gateway        {facts['gateway']}\n"
            f"  session        {url}\n"
            f"  say something  curl -s -X POST {url}/messages "
            "-H 'content-type: application/json' -d '{\"content\": \"hello\"}'\n"
            f"  read replies   curl -s '{url}/events?after=0&wait=5'\n"
            f"  control token  {facts['control_token_file']}\n"
            f"  agent token    {w / 'sessions' / session / 'agent-token'}\n"
            f"  move it        shadowpod migrate --workdir {w} --to IMAGE  "
            f"(images: {', '.join(facts['images'])})\n"
            f"  what runs      shadowpod status --workdir {w}\n"
            "Ctrl-C stops it.",
        )
        sys.stdout.flush()
        stop = asyncio.Event()
        # Ctrl-C, and SIGINT from a script too (a shell starts background jobs with
        # SIGINT ignored; asyncio's own Ctrl-C handling would then never fire).
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
    finally:
        await asyncio.shield(standing.close())


def _fresh(workdir: Path) -> None:
    if deployment_file(workdir).exists():
        if _running(deployment_file(workdir)):
            fail(
                f"a deployment runs in {workdir} already (see `shadowpod status --workdir "
                f"{workdir}`): stop it first, or give another directory",
                2,
            )
        fail(
            f"{workdir} holds a deployment whose `shadowpod up` was killed: give a new "
            "directory, or remove this one (its journal and logs are there)",
            2,
        )
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        used = any(workdir.iterdir())
    except OSError as exc:
        fail(f"cannot use --workdir {workdir}: {exc.strerror or exc}", 2)
    if used:
        fail(
            f"--workdir {workdir} is not empty (an earlier deployment's journal?): give a new "
            "or empty directory, or remove this one",
            2,
        )
    writable_workdir(workdir)


def _running(facts_file: Path) -> bool:
    try:
        pid = int(json.loads(facts_file.read_text())["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


@click.command("migrate")
@workdir_option
@click.option("--to", "target", required=True, help="The image to move the session to.")
@click.option("--session", help="The session to move (default: the deployment's only one).")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Follow the migration to its end; --no-wait: return once it has started.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the migration's record as JSON.")
def migrate(workdir: Path, target: str, session: str | None, wait: bool, as_json: bool) -> None:
    """Live-migrate the session of a running `shadowpod up` to another image.

    Shows the phases as they pass. Exits 0 when it succeeded (or, with --no-wait, has
    started), 1 when it rolled back or failed (the reason is printed), 2 when it cannot
    run (no deployment in --workdir, an unknown image or session).
    """
    console = Console(stderr=True)
    try:
        record = eventloop.run(_migrate(workdir, target, session, wait, console, as_json))
    except KeyboardInterrupt:
        fail("stopped watching: the migration goes on (shadowpod status)", 130)
    if as_json:
        click.echo(record.model_dump_json(indent=2))
    else:
        _print_result(record, console)
    if not wait or record.phase is Phase.SUCCEEDED:
        sys.exit(0)
    why = record.reason or "Failed"
    detail = f": {record.error}" if record.error else ""
    fail(f"migration {record.spec.id} {record.phase.value} ({why}){detail}", 1)


async def _migrate(
    workdir: Path,
    target: str,
    session: str | None,
    wait: bool,
    console: Console,
    as_json: bool,
) -> MigrationRecord:
    try:
        async with StandingClient(workdir) as client:
            record = await client.migrate(target, session=session)
            if not wait:
                return record
            if as_json:
                return await _follow(client, record, None)
            progress = PhaseProgress(record)
            with Live(progress.render(), console=console, refresh_per_second=10) as live:
                return await _follow(client, record, lambda r: live.update(progress.update(r)))
    except DeploymentUnreachable as exc:
        _cannot(str(exc))
    except DeploymentRefused as exc:
        _cannot(f"{exc} ({exc.reason})")


async def _follow(client: StandingClient, record: MigrationRecord, show: Any) -> MigrationRecord:
    while not record.done:
        await asyncio.sleep(POLL_S)
        record = await client.migration(record.spec.id)
        if show is not None:
            show(record)
    return record


def _cannot(message: str) -> NoReturn:
    fail(message, 2)


class PhaseProgress:
    """The phases a migration has passed and the one it is in, with their durations."""

    def __init__(self, record: MigrationRecord) -> None:
        self.record = record

    def update(self, record: MigrationRecord) -> Table:
        self.record = record
        return self.render()

    def render(self) -> Table:
        record = self.record
        table = Table(
            title=f"{record.spec.session}: {record.spec.source.image} → {record.spec.target.image}"
        )
        table.add_column("phase")
        table.add_column("duration", justify="right")
        now = time.time()
        for phase, timing in record.timings.items():
            if phase in {p.value for p in PHASE_STYLE}:
                continue
            ended = timing.ended
            seconds = (ended if ended is not None else now) - timing.started
            style = "cyan" if ended is None else ""
            marker = " …" if ended is None else ""
            table.add_row(Text(f"{phase}{marker}", style=style), f"{seconds * 1000:.0f} ms")
        table.add_row(
            Text("now", style="bold"),
            Text(record.phase.value, style=PHASE_STYLE.get(record.phase, "cyan")),
        )
        return table


def _print_result(record: MigrationRecord, console: Console) -> None:
    if not record.done:
        console.print(f"migration {record.spec.id} started ({record.phase.value})")
        return
    facts = Table(show_header=False, box=None)
    facts.add_row("migration", record.spec.id)
    facts.add_row("result", Text(record.phase.value, style=PHASE_STYLE.get(record.phase, "")))
    if record.total_s is not None:
        facts.add_row("total", f"{record.total_s * 1000:.0f} ms")
    if record.fence is not None:
        facts.add_row("fence wait (source idle)", f"{record.fence.waited_ms:.1f} ms")
    if record.fence_pause_ms is not None:
        facts.add_row("fence pause (first buffered message)", f"{record.fence_pause_ms:.1f} ms")
    if record.phase is Phase.SUCCEEDED:
        facts.add_row("owner now", f"{record.spec.target.name} ({record.spec.target.image})")
    console.print(facts)


@click.command("status")
@workdir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(workdir: Path, as_json: bool) -> None:
    """What a running `shadowpod up` serves: its gateway, sessions, owners, migrations.

    Exits 0, or 2 when no deployment runs in --workdir.
    """
    try:
        facts = eventloop.run(_status(workdir))
    except DeploymentUnreachable as exc:
        fail(str(exc), 2)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    console = Console()
    console.print(f"gateway {facts['gateway']} (pid {facts['pid']}), journal {facts['journal']}")
    sessions = Table("session", "image", "owner", "migrating", "url")
    for s in facts["sessions"]:
        sessions.add_row(s["session"], s["image"], s["owner"], str(s["migrating"]), s["url"])
    console.print(sessions)
    if facts["migrations"]:
        migrations = Table("migration", "from", "to", "phase", "reason")
        for m in facts["migrations"]:
            migrations.add_row(m["id"], m["from"], m["to"], m["phase"], m["reason"] or "")
        console.print(migrations)


async def _status(workdir: Path) -> dict[str, Any]:
    async with StandingClient(workdir) as client:
        return await client.status()
