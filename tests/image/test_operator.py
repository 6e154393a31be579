"""The operator entrypoint (``shadowpod operator …``), in a hardened container of the
image, against the emulated Kubernetes API (tests/kube's emulator, on a loopback
address the container reaches through the host's network).

Until the build has a ``shadowpod operator`` command, the test skips and says so: that
is found out from the image itself, not assumed.
"""

from __future__ import annotations

from pathlib import Path

import kmock
import pytest

from tests.image.docker import Containers, Images
from tests.image.support import (
    GatewayContainer,
    loopback_address,
    shared_with_container,
    wait_ready,
)
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(1500)  # the first test of a run builds the image

OPERATOR_CRDS = Path(__file__).resolve().parents[2] / "crds"
NO_OPERATOR = "no `shadowpod operator` command in this build"


async def operator_help(images: Images, containers: Containers) -> str:
    """``shadowpod operator --help`` as the image answers it; skips when there is no
    such command."""
    code, output = await containers.run_to_end(images.shadowpod, ["operator", "--help"])
    if code == 2 and "No such command 'operator'" in output:
        pytest.skip(NO_OPERATOR)
    assert code == 0, f"`shadowpod operator --help` failed with {code}:\n{output}"
    return output


async def test_operator_starts_against_the_api_and_reports_healthy(
    images: Images,
    containers: Containers,
    gateway: GatewayContainer,
    gateway_files: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    usage = await operator_help(images, containers)
    assert "--liveness" in usage, (
        "the image test probes the operator's health on Kopf's liveness endpoint "
        "(`--liveness URL`), which `shadowpod operator --help` does not list:\n" + usage
    )
    _, secrets = gateway_files
    host, port = loopback_address()
    args = ["operator", f"--liveness=http://{host}:{port}/healthz"]
    args += [flag for flag in ("--standalone", "--all-namespaces") if flag in usage]
    async with (
        ApiServerEmulator(crds=[OPERATOR_CRDS]) as emulator,
        kmock.Server(emulator),
    ):
        kube = tmp_path / "kube"
        kube.mkdir()
        KubeConnection.to_emulator(str(emulator.url).rstrip("/"), kube)
        operator = await containers.run(
            images.shadowpod,
            args,
            env={
                "KUBECONFIG": "/etc/shadowpod/kube/kubeconfig",
                "SHADOWPOD_GATEWAY_URL": gateway.url,
                "SHADOWPOD_CONTROL_TOKEN_FILE": "/etc/shadowpod/gateway/control-token",
            },
            mounts={
                shared_with_container(kube): "/etc/shadowpod/kube",
                secrets: "/etc/shadowpod/gateway",
            },
        )
        await wait_ready(f"http://{host}:{port}/healthz", operator)
        # And connected: it watches the API (the emulator counts open watches). Kopf
        # answers its probe as soon as its startup handlers ran, which on a busy machine
        # can be before its first watch request arrives: that is waited for.
        await eventually(lambda: emulator.watchers > 0, timeout=30)
        # A pod's termination: SIGTERM; Kopf stops its watches and exits 0.
        assert await operator.stop(grace_s=30) == 0
    assert emulator.internal_errors == []
