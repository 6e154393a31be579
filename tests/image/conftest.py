"""Fixtures of the image tests: the images built for real, hardened containers, a
gateway container; the API-server emulator and the kubelet stand-in in container mode
(pods as containers of the image).

The image tests build the image (minutes from cold) and run containers, so
``make test`` skips them, saying so: they run with ``make image-test``
(``SHADOWPOD_IMAGE_TESTS=1``), and skip, saying why, where no Docker daemon answers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import kmock
import pytest

from shadowpod.local.images import ImageMap
from tests.image.docker import (
    LABEL,
    Containers,
    Images,
    build_images,
    docker_unavailable,
    remove_orphans,
)
from tests.image.support import (
    GatewayContainer,
    loopback_address,
    shared_with_container,
    wait_ready,
)
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.kubelet import Kubelet
from tests.kube.kubelet.docker import DockerContainers

ENABLE_ENV: Final = "SHADOWPOD_IMAGE_TESTS"
CONTROL_TOKEN: Final = "image-test-control-token"
OPERATOR_CRDS: Final = Path(__file__).resolve().parents[2] / "crds"


@pytest.fixture(autouse=True, scope="session")
def _image_tests_wanted() -> None:
    if reason := docker_unavailable():
        pytest.skip(reason)
    if os.environ.get(ENABLE_ENV) != "1":
        pytest.skip(
            f"the image tests build the image and run containers: `make image-test` runs them "
            f"({ENABLE_ENV}=1)"
        )


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    """The images of ``make image``, built once per run (a warm build takes seconds)."""
    return build_images(tmp_path_factory.mktemp("image-build") / "build.log")


@pytest.fixture
async def containers() -> AsyncIterator[Containers]:
    """Start containers with ``containers.run(...)``; all are removed afterwards, and
    their logs printed (pytest shows them when the test failed). Those of an earlier
    run that was killed are removed first."""
    await remove_orphans(LABEL)
    running = Containers()
    try:
        yield running
    finally:
        for name, logs in (await running.remove_all()).items():
            print(f"--- logs of container {name} ---\n{logs}")


@pytest.fixture
def gateway_files(tmp_path: Path) -> tuple[Path, Path]:
    """A journal directory the gateway's user may write, and its control token file."""
    journal = tmp_path / "journal"
    journal.mkdir()
    secrets = tmp_path / "gateway-secrets"
    secrets.mkdir()
    (secrets / "control-token").write_text(CONTROL_TOKEN + "\n")
    return shared_with_container(journal, writable=True), shared_with_container(secrets)


@pytest.fixture
async def gateway(
    images: Images, containers: Containers, gateway_files: tuple[Path, Path]
) -> GatewayContainer:
    """The gateway, in a container of the image, on SQLite in a mounted directory."""
    journal, secrets = gateway_files
    host, port = loopback_address()
    container = await containers.run(
        images.shadowpod,
        [
            "gateway",
            f"--host={host}",
            f"--port={port}",
            "--journal=sqlite:///var/lib/shadowpod/journal.db",
            "--control-token-file=/etc/shadowpod/gateway/control-token",
        ],
        mounts={secrets: "/etc/shadowpod/gateway"},
        writable={journal: "/var/lib/shadowpod"},
    )
    url = f"http://{host}:{port}"
    await wait_ready(f"{url}/readyz", container)
    return GatewayContainer(url, CONTROL_TOKEN, container, journal)


@pytest.fixture
async def emulator() -> AsyncIterator[ApiServerEmulator]:
    """The API-server emulator of tests/kube, serving the operator's CRDs."""
    async with ApiServerEmulator(crds=[OPERATOR_CRDS]) as server, kmock.Server(server):
        yield server
    assert server.internal_errors == []


@pytest.fixture
def kube(emulator: ApiServerEmulator, tmp_path: Path) -> KubeConnection:
    directory = tmp_path / "kube"
    directory.mkdir()
    connection = KubeConnection.to_emulator(str(emulator.url).rstrip("/"), directory)
    shared_with_container(directory)  # the operator's container reads the kubeconfig
    return connection


@pytest.fixture
async def kubelet(kube: KubeConnection, tmp_path: Path) -> AsyncIterator[Kubelet]:
    """The kubelet stand-in in container mode, one node; its containers are all removed
    when it stops (and checked to be)."""
    docker_mode = DockerContainers()
    workdir = tmp_path / "kubelet"
    try:
        async with (
            kube.api() as api,
            Kubelet(api, ImageMap(images={}), workdir, docker=docker_mode) as running,
        ):
            await running.add_node("node-1")
            yield running
    finally:
        for log in sorted(workdir.glob("pods/*/containers/*/log")):
            print(f"--- {log.relative_to(workdir)} ---\n{log.read_text(errors='replace')}")
        left = await docker_mode.listed()
        await docker_mode.remove_all()
    assert left == [], f"the kubelet left containers behind: {left}"
