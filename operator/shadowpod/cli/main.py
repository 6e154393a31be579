"""Entry point of the ``shadowpod`` command.

Commands are imported when they run, not when the group is built (click's "lazily
loading subcommands" pattern): ``shadowpod --help`` and ``--version`` would otherwise
import the operator, the benchmarks and the gateway — seconds of imports before a line
of help. ``COMMANDS`` keeps each command's one-line help, so the group's help imports
none of them (a test checks each line against the command's own docstring).
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Final, NoReturn

import click

from shadowpod import __version__

# name: (module:attribute, the command's short help as its --help would show it)
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "bench": ("shadowpod.cli.bench:bench", "Measure Shadowpod on this machine."),
    "crds": (
        "shadowpod.cli.crds:crds",
        "Generate crds/ from the AgentSession and AgentMigration models.",
    ),
    "demo": (
        "shadowpod.cli.demo:demo",
        "Run a live migration of an agent session (v1 → v2) under load, on this machine.",
    ),
    "gateway": (
        "shadowpod.cli.gateway:gateway",
        "Serve sessions: clients, owners, shadows and the control API over HTTP.",
    ),
    "golden": (
        "shadowpod.cli.golden:golden",
        "Golden sessions: record real turns, replay them against a new version.",
    ),
    "kubectl": (
        "shadowpod.cli.kubectl:kubectl",
        "Shadowpod's sessions and migrations on a cluster (a kubectl plugin).",
    ),
    "migrate": (
        "shadowpod.cli.up:migrate",
        "Live-migrate the session of a running `shadowpod up` to another image.",
    ),
    "node-agent": (
        "shadowpod.cli.node_agent:node_agent",
        "Turn the kubelet's checkpoint archives of agent containers into checkpoint images.",
    ),
    "operator": (
        "shadowpod.cli.operator:operator",
        "Reconcile AgentSessions and AgentMigrations: live migration on Kubernetes.",
    ),
    "status": (
        "shadowpod.cli.up:status",
        "What a running `shadowpod up` serves: its gateway, sessions, owners, migrations.",
    ),
    "suspend": (
        "shadowpod.cli.up:suspend",
        "Suspend the session of a running `shadowpod up`; a message wakes it.",
    ),
    "fork": (
        "shadowpod.cli.up:fork",
        "Fork a session of a running `shadowpod up` into a new session NAME.",
    ),
    "resume": (
        "shadowpod.cli.up:resume",
        "Resume a suspended session of a running `shadowpod up`.",
    ),
    "up": (
        "shadowpod.cli.up:up",
        "Start a gateway and an agent session in --workdir, and keep them serving.",
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported only when one is run (or its help shown)."""

    def __init__(self, *args: object, lazy: dict[str, tuple[str, str]], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        target = self.lazy[cmd_name][0]
        module, _, attribute = target.partition(":")
        try:
            command = getattr(importlib.import_module(module), attribute)
        except KeyboardInterrupt:
            _interrupted()
        if not isinstance(command, click.Command):  # pragma: no cover — a wrong table entry
            raise TypeError(f"{target} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, self.lazy[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="shadowpod")
def cli() -> None:
    """Shadowpod: move long-running AI agent sessions between pods while they keep serving."""


def _interrupted() -> NoReturn:
    """Ctrl-C before a command started anything (while it is imported, during --help):
    nothing to stop, no traceback; 130 as the signal would."""
    click.echo("interrupted", err=True)
    sys.exit(128 + signal.SIGINT)


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:
        _interrupted()
