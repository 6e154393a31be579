"""``shadowpod gateway``: run the gateway."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import click

from shadowpod import eventloop, logs
from shadowpod.cli.errors import fail
from shadowpod.domain.errors import ShadowpodError
from shadowpod.gateway.config import GatewayConfig, read_tokens
from shadowpod.journal.factory import store_from_url

LOG_LEVELS = ["debug", "info", "warning", "error"]
# Exit codes: 2 when the settings are wrong (as for a usage error), 1 when the gateway
# cannot start as the world is (the database down, the port taken).
BAD_SETTINGS = 2
CANNOT_START = 1


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
@click.option(
    "--max-connections-per-peer",
    default=256,
    show_default=True,
    type=click.IntRange(0),
    help="Most connections one client address may hold (0: no limit; behind a proxy "
    "every client has the proxy's address).",
)
@click.option(
    "--max-streams",
    default=1000,
    show_default=True,
    type=click.IntRange(1),
    help="Most event streams (SSE) open at once on this gateway; one more is 503.",
)
@click.option(
    "--max-streams-per-session",
    default=64,
    show_default=True,
    type=click.IntRange(1),
    help="Most event streams open at once on one session; one more is 503.",
)
@click.option(
    "--header-timeout",
    "header_timeout_s",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0, 3600, min_open=True),
    help="Seconds a request's headers may take (and a connection may stay idle).",
)
@click.option(
    "--body-timeout",
    "body_timeout_s",
    default=300.0,
    show_default=True,
    type=click.FloatRange(0, 3600, min_open=True),
    help="Seconds a request body may take to arrive.",
)
@click.option(
    "--body-idle-timeout",
    "body_idle_timeout_s",
    default=15.0,
    show_default=True,
    type=click.FloatRange(0, 3600, min_open=True),
    help="Longest pause, in seconds, while a request body is sent.",
)
@click.option("--no-schedules", is_flag=True, help="Do not fire schedules (another gateway does).")
@click.option(
    "--advertise-url",
    envvar="SHADOWPOD_ADVERTISE_URL",
    default=None,
    help="Where the other replicas reach this one (http://POD_IP:PORT). With a "
    "PostgreSQL journal: sessions are placed by lease, requests forwarded to their holder.",
)
@click.option("--replica-id", envvar="SHADOWPOD_REPLICA_ID", default=None, help="Default: the URL.")
@click.option(
    "--lease-ttl",
    "lease_ttl_s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(1, 300),
    help="Seconds a session lease outlives its holder's last renewal (takeover bound).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
)
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
    max_connections_per_peer: int,
    max_streams: int,
    max_streams_per_session: int,
    header_timeout_s: float,
    body_timeout_s: float,
    body_idle_timeout_s: float,
    no_schedules: bool,
    advertise_url: str | None,
    replica_id: str | None,
    lease_ttl_s: float,
    log_level: str,
    log_format: str,
) -> None:
    """Serve sessions: clients, owners, shadows and the control API over HTTP.

    Exits 2 when a setting is wrong, 1 when it cannot start (the journal cannot be
    opened, the address is taken): one line on stderr says what to do.
    """
    eventloop.exit_with_parent()
    logs.configure(log_level, log_format)
    try:
        store_from_url(journal_url)  # a URL we cannot use is refused before anything starts
        config = GatewayConfig(
            journal_url=journal_url,
            host=host,
            port=port,
            control_token_hashes=_tokens(control_token_file, "--control-token-file"),
            client_token_hashes=_tokens(client_token_file, "--client-token-file")
            if client_token_file
            else frozenset(),
            max_body_bytes=max_body_bytes,
            max_snapshot_bytes=max_snapshot_bytes,
            max_connections_per_peer=max_connections_per_peer,
            max_streams=max_streams,
            max_streams_per_session=max_streams_per_session,
            header_timeout_s=header_timeout_s,
            body_timeout_s=body_timeout_s,
            body_idle_timeout_s=body_idle_timeout_s,
            schedules=not no_schedules,
            advertise_url=advertise_url,
            replica_id=replica_id,
            lease_ttl_s=lease_ttl_s,
        )
    except ValueError as exc:
        fail(str(exc), BAD_SETTINGS)
    from shadowpod.gateway.app import serve

    try:
        eventloop.run(serve(config))
    except ShadowpodError as exc:  # the journal cannot be opened (see the stores' open)
        fail(f"the gateway cannot start: {exc}", CANNOT_START)
    except OSError as exc:
        fail(_cannot_listen(host, port, exc), CANNOT_START)


def _tokens(path: Path, option: str) -> frozenset[str]:
    try:
        return read_tokens(path)
    except UnicodeDecodeError:
        raise ValueError(f"{option} {path} is not text: write one token per line (UTF-8)") from None
    except OSError as exc:
        raise ValueError(f"cannot read {option} {path}: {exc.strerror or exc}") from None


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {where}: --host {host!r} is not a known name or address"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: another process is listening there; stop it or "
            "choose another --port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {where}: {host} is not an address of this machine; use one of "
            "its addresses, or 0.0.0.0 for all of them"
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot listen on {where}: this user may not use port {port} (ports below 1024 "
            "need privileges); choose another --port"
        )
    return f"cannot listen on {where}: {exc.strerror or exc}"
