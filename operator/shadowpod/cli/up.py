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
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
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
from shadowpod.local.gateway_process import port_free
from shadowpod.local.images import ImageMap, reference_images
from shadowpod.local.standing import (
    SavedDeployment,
    StandingDeployment,
    StandingSession,
    deployment_file,
    saved_file,
)
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
    help="An image map (YAML) of the agent; default: the reference agent's (or, resuming, "
    "the map the deployment was started with).",
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
    started (exit 0). Run again on the same --workdir, it resumes: the gateway on the
    same journal, each session's owner at the next epoch from its journal (--image and
    --session are then the deployment's own). A first start that fails leaves nothing
    in --workdir. Exit 2 when it cannot start.
    """
    _not_running(workdir)
    try:
        saved = SavedDeployment.load(workdir)
    except (ValueError, OSError) as exc:
        fail(str(exc), 2)
    if saved is not None:
        _resume(workdir, saved, images_path, port)
        return
    if deployment_file(workdir).exists():
        fail(
            f"{workdir} holds a deployment whose `shadowpod up` was killed before it "
            "started: give a new directory, or remove this one",
            2,
        )
    try:
        images = ImageMap.load(images_path) if images_path else reference_images()
        images.resolve(image)
    except (ValueError, ImageNotFound) as exc:
        fail(str(exc), 2)
    created = _fresh(workdir)
    standing = StandingDeployment(workdir, images, port=port, images_path=images_path)
    try:
        eventloop.run(_up(standing, _started(session, image)), terminate_gracefully=True)
    except (KeyboardInterrupt, eventloop.Terminated):
        pass
    except Exception as exc:  # noqa: BLE001 — cannot start: say why in one line
        _clean(workdir, created)
        fail(f"could not start: {exc}; nothing was left in {workdir}", 2)
    if not saved_file(workdir).exists():  # stopped before it served: nothing to resume
        _clean(workdir, created)
    click.echo("stopped: every process it started was stopped", err=True)


def _resume(
    workdir: Path, saved: SavedDeployment, images_path: Path | None, port: int | None
) -> None:
    try:
        images_path = images_path or saved.images
        images = ImageMap.load(images_path) if images_path else reference_images()
    except (ValueError, OSError) as exc:
        fail(f"cannot resume {workdir}: its image map: {exc}; give --images", 2)
    writable_workdir(workdir)
    if port is None and port_free(saved.port):
        port = saved.port  # the session's URL stays what it was where it can
    standing = StandingDeployment(workdir, images, port=port, images_path=images_path)
    try:
        eventloop.run(_up(standing, _resumed(saved)), terminate_gracefully=True)
    except (KeyboardInterrupt, eventloop.Terminated):
        pass
    except ImageNotFound as exc:
        fail(f"cannot resume {workdir}: {exc}; give --images with the map that has it", 2)
    except Exception as exc:  # noqa: BLE001 — cannot start: say why in one line
        fail(
            f"could not resume: {exc} (the journal and logs stay in {workdir}; run "
            "shadowpod up on it again to retry)",
            2,
        )
    click.echo("stopped: every process it started was stopped", err=True)


Start = Callable[[StandingDeployment], Awaitable[list[tuple[StandingSession, str]]]]


def _started(session: str, image: str) -> Start:
    async def start(standing: StandingDeployment) -> list[tuple[StandingSession, str]]:
        started = await standing.start(session, image)
        return [(started, f"serving on {image}")]

    return start


def _resumed(saved: SavedDeployment) -> Start:
    async def resume(standing: StandingDeployment) -> list[tuple[StandingSession, str]]:
        return [
            (s, f"resumed on {s.owner.image} from its journal (epoch {epoch} → {epoch + 1})")
            for s, epoch in await standing.resume(saved)
        ]

    return resume


async def _up(standing: StandingDeployment, start: Start) -> None:
    try:
        started = await start(standing)
        facts = standing.status()
        w = standing.workdir
        for session, how in started:
            url = f"{facts['gateway']}/v1/sessions/{session.name}"
            click.echo(
                f"session {session.name!r} {how} (instance {session.owner.name})\n"
                f"  gateway        {facts['gateway']}\n"
                f"  session        {url}\n"
                f"  say something  curl -s -X POST {url}/messages "
                "-H 'content-type: application/json' -d '{\"content\": \"hello\"}'\n"
                f"  read replies   curl -s '{url}/events?after=0&wait=5'\n"
                f"  control token  {facts['control_token_file']}\n"
                f"  agent token    {w / 'sessions' / session.name / 'agent-token'}\n"
                f"  move it        shadowpod migrate --workdir {w} --to IMAGE  "
                f"(images: {', '.join(facts['images'])})\n"
                f"  what runs      shadowpod status --workdir {w}"
            )
        click.echo(f"Ctrl-C stops it; shadowpod up --workdir {w} resumes it.")
        sys.stdout.flush()
        stop = asyncio.Event()
        # Ctrl-C, and SIGINT from a script too (a shell starts background jobs with
        # SIGINT ignored; asyncio's own Ctrl-C handling would then never fire).
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
    finally:
        await asyncio.shield(standing.close())


def _not_running(workdir: Path) -> None:
    if deployment_file(workdir).exists() and _running(deployment_file(workdir)):
        fail(
            f"a deployment runs in {workdir} already (see `shadowpod status --workdir "
            f"{workdir}`): stop it first, or give another directory",
            2,
        )


def _fresh(workdir: Path) -> bool:
    """Make ``workdir`` ready for a first start; whether this run created it."""
    created = not workdir.exists()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        used = any(workdir.iterdir())
    except OSError as exc:
        fail(f"cannot use --workdir {workdir}: {exc.strerror or exc}", 2)
    if used:
        fail(
            f"--workdir {workdir} is not empty and holds no deployment to resume: give a new "
            "or empty directory, or remove this one",
            2,
        )
    writable_workdir(workdir)
    return created


def _clean(workdir: Path, created: bool) -> None:
    """What a first start that did not come up made: gone, so that the next `up` on
    the same directory starts afresh."""
    if created:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for child in workdir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


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


@click.command("suspend")
@workdir_option
@click.option("--session", help="The session (default: the deployment's only one).")
def suspend(workdir: Path, session: str | None) -> None:
    """Suspend the session of a running `shadowpod up`; a message wakes it.

    Its owner is fenced out after a final snapshot and stopped; messages keep being
    journaled and the first one wakes it. Exits 0 when suspended, 2 when it cannot be
    (not running, busy, suspended)."""
    answer = eventloop.run(_lifecycle(workdir, "suspend", session))
    click.echo(f"session {answer['session']} suspended (final snapshot at {answer['snapshot']})")


@click.command("fork")
@workdir_option
@click.argument("name")
@click.option("--seq", required=True, type=click.IntRange(0), help="Fork at this journal seq.")
@click.option("--session", help="The session to fork (default: the deployment's only one).")
def fork(workdir: Path, name: str, seq: int, session: str | None) -> None:
    """Fork a session of a running `shadowpod up` into a new session NAME.

    NAME starts from the session's state at --seq (its journal shared up to there) with
    an owner of its own; the session serves on. Exits 0 when NAME serves, 2 when it
    cannot be made (no such seq, NAME taken, not running)."""
    try:
        answer = eventloop.run(_fork(workdir, name, seq, session))
    except DeploymentUnreachable as exc:
        _cannot(str(exc))
    except DeploymentRefused as exc:
        _cannot(f"{exc} ({exc.reason})")
    click.echo(
        f"session {answer['session']} forked from {answer['fork_of']} at seq {answer['seq']}:"
        f" owner {answer['owner']}"
    )


async def _fork(workdir: Path, name: str, seq: int, session: str | None) -> dict[str, Any]:
    async with StandingClient(workdir) as client:
        return await client.fork(name, seq, session=session)


@click.command("resume")
@workdir_option
@click.option("--session", help="The session (default: the deployment's only one).")
def resume(workdir: Path, session: str | None) -> None:
    """Resume a suspended session of a running `shadowpod up`.

    A new owner from the snapshot and the journal answers what waited, in order."""
    answer = eventloop.run(_lifecycle(workdir, "resume", session))
    click.echo(f"session {answer['session']} resumed: owner {answer['owner']}")


async def _lifecycle(workdir: Path, what: str, session: str | None) -> dict[str, Any]:
    try:
        async with StandingClient(workdir) as client:
            if what == "suspend":
                return await client.suspend(session=session)
            return await client.resume(session=session)
    except DeploymentUnreachable as exc:
        _cannot(str(exc))
    except DeploymentRefused as exc:
        _cannot(f"{exc} ({exc.reason})")


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
