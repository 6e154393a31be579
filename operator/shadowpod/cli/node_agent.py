"""``shadowpod node-agent``: the kubelet's checkpoint archives on this node, made
checkpoint images and pushed (``shadowpod.kube.nodeagent``; docs/criu.md)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
from pathlib import Path

import click

from shadowpod import logs
from shadowpod.cli.errors import fail

BAD_SETTINGS = 2
LOG_LEVELS = ["debug", "info", "warning", "error"]


@click.command("node-agent")
@click.option(
    "--registry",
    envvar="SHADOWPOD_CHECKPOINT_REGISTRY",
    required=True,
    help="Where to push checkpoint images ([host[:port]/]path): the operator's"
    " --checkpoint-registry.",
)
@click.option(
    "--checkpoints-dir",
    default="/var/lib/kubelet/checkpoints",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The kubelet's checkpoint archives (its --root-dir/checkpoints).",
)
@click.option(
    "--storage-dir",
    default="/var/lib/shadowpod-node-agent",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="buildah's storage (made mode 0700).",
)
@click.option(
    "--container",
    "containers",
    multiple=True,
    default=("agent",),
    show_default=True,
    help="Image archives of containers of this name only (repeatable).",
)
@click.option("--tls-verify/--no-tls-verify", default=True, show_default=True)
@click.option(
    "--authfile",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The registry credentials (containers-auth.json).",
)
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(0.1, 600))
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="info")
@click.option(
    "--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True
)
def node_agent(
    registry: str,
    checkpoints_dir: Path,
    storage_dir: Path,
    containers: tuple[str, ...],
    tls_verify: bool,
    authfile: Path | None,
    interval: float,
    log_level: str,
    log_format: str,
) -> None:
    """Turn the kubelet's checkpoint archives of agent containers into checkpoint images.

    Runs as root on every node of the CRIU path (the chart's nodeAgent). Exits 2 when a
    setting is wrong (buildah missing, no checkpoint directory).
    """
    from shadowpod.kube.nodeagent import NodeAgent, NodeAgentConfig

    logs.configure(log_level, log_format)
    if shutil.which("buildah") is None:
        fail("buildah is not on the PATH: the node agent builds images with it", BAD_SETTINGS)
    if not checkpoints_dir.is_dir():
        fail(f"{checkpoints_dir} is not a directory: mount the kubelet's", BAD_SETTINGS)
    config = NodeAgentConfig(
        registry=registry.rstrip("/"),
        storage_dir=storage_dir,
        checkpoints_dir=checkpoints_dir,
        containers=containers,
        tls_verify=tls_verify,
        authfile=authfile,
        interval_s=interval,
    )

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await NodeAgent(config).run(stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
