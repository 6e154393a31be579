"""``shadowpod operator``: run the Kubernetes operator."""

from __future__ import annotations

from pathlib import Path

import click

from shadowpod import logs
from shadowpod.cli.errors import fail

LOG_LEVELS = ["debug", "info", "warning", "error"]
BAD_SETTINGS = 2
CANNOT_RUN = 1


@click.command("operator")
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="A namespace to serve (repeatable); see --all-namespaces.",
)
@click.option("--all-namespaces", is_flag=True, help="Serve every namespace.")
@click.option(
    "--standalone/--peering-enabled",
    default=True,
    show_default=True,
    help="One replica, no peering (the default); or coordinate replicas through peering.",
)
@click.option("--peering", "peering", default=None, help="The peering object's name.")
@click.option(
    "--liveness", default=None, help="Serve Kopf's health probe, e.g. http://0.0.0.0:8080/healthz."
)
@click.option("--metrics-host", default="0.0.0.0", show_default=True)
@click.option(
    "--metrics-port",
    default=9090,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Where /metrics is served; 0 serves none.",
)
@click.option(
    "--gateway-url",
    envvar="SHADOWPOD_GATEWAY_URL",
    required=True,
    help="The gateway's control API, as the operator reaches it.",
)
@click.option(
    "--agent-gateway-url",
    envvar="SHADOWPOD_AGENT_GATEWAY_URL",
    default=None,
    help="The gateway as agent pods reach it (its Service); defaults to --gateway-url.",
)
@click.option(
    "--control-token-file",
    envvar="SHADOWPOD_CONTROL_TOKEN_FILE",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File whose first line is the gateway's control token.",
)
@click.option(
    "--kubeconfig", envvar="KUBECONFIG", default=None, help="Outside a cluster: its kubeconfig."
)
@click.option(
    "--criu/--no-criu",
    default=False,
    show_default=True,
    help="Allow the CRIU path: checkpoints through KEP-5823's PodCheckpoint where served, else"
    " the kubelet API (RBAC nodes/proxy create).",
)
@click.option(
    "--checkpoint-registry",
    envvar="SHADOWPOD_CHECKPOINT_REGISTRY",
    default=None,
    help="Where the node agents push checkpoint images ([host[:port]/]path); the CRIU path"
    " needs it.",
)
@click.option(
    "--checkpoint-registry-insecure/--no-checkpoint-registry-insecure",
    default=False,
    show_default=True,
    help="Reach the checkpoint registry over plain HTTP (to delete checkpoint images).",
)
@click.option(
    "--checkpoint-registry-authfile",
    envvar="SHADOWPOD_CHECKPOINT_REGISTRY_AUTHFILE",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The checkpoint registry's credentials (dockerconfigjson), to delete checkpoint"
    " images once their migration has ended.",
)
@click.option(
    "--checkpoint-timeout",
    default=60,
    show_default=True,
    type=click.IntRange(1, 3600),
    help="Seconds the kubelet may take for one checkpoint (grows with the agent's memory).",
)
@click.option(
    "--reconcile-interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    help="Seconds between a session's safety-net checks (pod and node events and a"
    " finished migration trigger one at once); each costs one gateway and two API reads.",
)
@click.option(
    "--max-concurrent-migrations",
    default=10,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Migrations running at once (fleet, drain or by hand); the rest wait, Queued.",
)
@click.option(
    "--max-concurrent-migrations-per-node",
    default=2,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Of those, running out of one source node (at most --max-concurrent-migrations).",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="info")
@click.option(
    "--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True
)
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    standalone: bool,
    peering: str | None,
    liveness: str | None,
    metrics_host: str,
    metrics_port: int,
    gateway_url: str,
    agent_gateway_url: str | None,
    control_token_file: Path,
    kubeconfig: str | None,
    criu: bool,
    checkpoint_registry: str | None,
    checkpoint_registry_insecure: bool,
    checkpoint_registry_authfile: Path | None,
    checkpoint_timeout: int,
    reconcile_interval: float,
    max_concurrent_migrations: int,
    max_concurrent_migrations_per_node: int,
    log_level: str,
    log_format: str,
) -> None:
    """Reconcile AgentSessions and AgentMigrations: live migration on Kubernetes.

    Exits 2 when a setting is wrong, 1 when it cannot run (one line on stderr says why).
    """
    from shadowpod.kube.config import OperatorConfig
    from shadowpod.kube.run import run

    logs.configure(log_level, log_format)
    if all_namespaces == bool(namespaces):
        fail(
            "give -n/--namespace (repeatable) or --all-namespaces, not both nor neither",
            BAD_SETTINGS,
        )
    lines = [line.strip() for line in control_token_file.read_text().splitlines() if line.strip()]
    if not lines:
        fail(
            f"{control_token_file} holds no control token: put the gateway's token in it",
            BAD_SETTINGS,
        )
    if max_concurrent_migrations_per_node > max_concurrent_migrations:
        fail(
            f"--max-concurrent-migrations-per-node ({max_concurrent_migrations_per_node}) exceeds"
            f" --max-concurrent-migrations ({max_concurrent_migrations}): lower it",
            BAD_SETTINGS,
        )
    config = OperatorConfig(
        gateway_url=gateway_url.rstrip("/"),
        agent_gateway_url=(agent_gateway_url or gateway_url).rstrip("/"),
        control_token=lines[0],
        namespaces=namespaces,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        reconcile_interval_s=reconcile_interval,
        criu=criu,
        checkpoint_registry=checkpoint_registry or None,
        checkpoint_registry_insecure=checkpoint_registry_insecure,
        checkpoint_registry_authfile=checkpoint_registry_authfile,
        checkpoint_timeout_s=checkpoint_timeout,
        max_concurrent_migrations=max_concurrent_migrations,
        max_concurrent_migrations_per_node=max_concurrent_migrations_per_node,
    )
    try:
        run(
            config,
            clusterwide=all_namespaces,
            standalone=standalone and peering is None,
            peering=peering,
            liveness=liveness,
            metrics_host=metrics_host,
            metrics_port=metrics_port,
        )
    except KeyboardInterrupt:
        return
    except Exception as exc:  # noqa: BLE001 - one line that says why, not a traceback
        fail(f"the operator stopped: {type(exc).__name__}: {exc}", CANNOT_RUN)
