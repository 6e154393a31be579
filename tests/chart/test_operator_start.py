"""The operator starts as the chart runs it: the chart installed by real Helm into the
emulated API server (its CRDs with it), then `shadowpod operator` run as a process with
exactly the args and environment of the rendered Deployment, reporting healthy on the
probe the Deployment's livenessProbe asks and serving /metrics on its metrics port."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.chart.helm import RELEASE, Helm
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator

OPERATOR = f"{RELEASE}-shadowpod-operator"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.text()


@pytest.mark.timeout(120)
async def test_the_operator_starts_with_the_charts_args_and_reports_healthy(
    helm: Helm, cluster: tuple[ApiServerEmulator, KubeConnection], tmp_path: Path
) -> None:
    health, metrics = free_port(), free_port()
    rendered = await helm.install({"operator": {"healthPort": health, "metricsPort": metrics}})
    container = rendered.container(OPERATOR)
    probe = container["livenessProbe"]["httpGet"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    token = tmp_path / "token"
    token.write_text("a-control-token\n")
    env = {item["name"]: item["value"] for item in container["env"]}
    # Only what a pod has and a process here has not: the mounted token's path, and the
    # API's credentials (a pod's ServiceAccount token; here the emulator's kubeconfig).
    assert env["SHADOWPOD_CONTROL_TOKEN_FILE"].startswith("/var/run/shadowpod/control/")
    env["SHADOWPOD_CONTROL_TOKEN_FILE"] = str(token)
    # (Kopf's kubeconfig reader wants credentials: a token, as a pod's would be.)
    kubeconfig = yaml.safe_load(cluster[1].kubeconfig.read_text())
    kubeconfig["users"][0]["user"] = {"token": "operator-service-account"}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    env["KUBECONFIG"] = str(tmp_path / "kubeconfig")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shadowpod",
        *container["args"],
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        status, body = 0, ""
        for _ in range(200):
            if process.returncode is not None:
                break
            try:
                status, body = await get(f"http://127.0.0.1:{ports[probe['port']]}{probe['path']}")
                if status == 200:
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        assert process.returncode is None, "the operator exited"
        assert status == 200, body
        status, text = await get(f"http://127.0.0.1:{ports['metrics']}/metrics")
        assert status == 200
        assert "shadowpod_build_info" in text
    finally:
        if process.returncode is None:
            process.terminate()
        output = (await process.communicate())[0].decode()
        print(output[:3000])
