"""Entry point of the ``shadowpod`` command."""

from __future__ import annotations

import click

from shadowpod import __version__
from shadowpod.cli.bench import bench
from shadowpod.cli.crds import crds
from shadowpod.cli.demo import demo
from shadowpod.cli.gateway import gateway
from shadowpod.cli.golden import golden
from shadowpod.cli.kubectl import kubectl
from shadowpod.cli.node_agent import node_agent
from shadowpod.cli.operator import operator
from shadowpod.cli.up import migrate, status, up


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shadowpod")
def cli() -> None:
    """Shadowpod: move long-running AI agent sessions between pods while they keep serving."""


cli.add_command(bench)
cli.add_command(gateway)
cli.add_command(demo)
cli.add_command(crds)
cli.add_command(operator)
cli.add_command(kubectl)
cli.add_command(golden)
cli.add_command(node_agent)
cli.add_command(up)
cli.add_command(migrate)
cli.add_command(status)


def main() -> None:
    cli()
