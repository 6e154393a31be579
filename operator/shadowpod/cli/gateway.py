"""``shadowpod gateway``: run the gateway."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from shadowpod import eventloop, logs
from shadowpod.gateway.config import GatewayConfig, read_tokens


@click.command("gateway")
@click.option(
    "--journal",
    "journal_url",
    envvar="SHADOWPOD_JOURNAL",
    default="sqlite:///var/lib/shadowpod/journal.db",
    show_default=True,
    help="Journal store URL: sqlite:///path.db or postgresql://host/db.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8800, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--control-token-file",
    envvar="SHADOWPOD_CONTROL_TOKEN_FILE",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File with the control token(s) the operator and engine present, one per line.",
)
@click.option(
    "--client-token-file",
    envvar="SHADOWPOD_CLIENT_TOKEN_FILE",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Tokens clients must present; without it, client routes are open.",
)
@click.option("--max-body-bytes", default=1024 * 1024, show_default=True, type=click.IntRange(1024))
@click.option(
    "--max-snapshot-bytes",
    default=256 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1024),
    help="Largest snapshot an agent may store (a whole session state).",
)
@click.option("--no-schedules", is_flag=True, help="Do not fire schedules (another gateway does).")
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True
)
def gateway(
    journal_url: str,
    host: str,
    port: int,
    control_token_file: Path,
    client_token_file: Path | None,
    max_body_bytes: int,
    max_snapshot_bytes: int,
    no_schedules: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve sessions: clients, owners, shadows and the control API over HTTP."""
    eventloop.exit_with_parent()
    logs.configure(log_level, log_format)
    try:
        config = GatewayConfig(
            journal_url=journal_url,
            host=host,
            port=port,
            control_token_hashes=read_tokens(control_token_file),
            client_token_hashes=read_tokens(client_token_file)
            if client_token_file
            else frozenset(),
            max_body_bytes=max_body_bytes,
            max_snapshot_bytes=max_snapshot_bytes,
            schedules=not no_schedules,
        )
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    from shadowpod.gateway.app import serve

    try:
        eventloop.run(serve(config))
    except OSError as exc:
        click.echo(f"error: cannot serve on {host}:{port}: {exc}", err=True)
        sys.exit(1)
