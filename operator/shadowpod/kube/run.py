"""Running the operator: Kopf with the operator's handlers, and ``/metrics``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection

import kopf
from prometheus_client import start_http_server

from shadowpod.kube.config import OperatorConfig
from shadowpod.kube.handlers import OperatorMemo, registry
from shadowpod.kube.metrics import OperatorMetrics


def run(
    config: OperatorConfig,
    *,
    clusterwide: bool,
    standalone: bool,
    peering: str | None,
    liveness: str | None,
    metrics_host: str,
    metrics_port: int,
    stop: threading.Event | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop``); ``/metrics`` on ``metrics_port`` (0: none)."""
    metrics = OperatorMetrics()
    if metrics_port:
        start_http_server(metrics_port, addr=metrics_host, registry=metrics.registry)
    namespaces: Collection[str] = () if clusterwide else config.namespaces
    asyncio.run(
        kopf.operator(
            registry=registry(config),
            memo=OperatorMemo(config, metrics),
            standalone=standalone,
            peering_name=peering,
            liveness_endpoint=liveness,
            clusterwide=clusterwide,
            namespaces=namespaces,
            stop_flag=stop,
        )
    )
