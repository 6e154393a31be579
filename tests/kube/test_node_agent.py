"""The node agent for real: a kubelet-style checkpoint archive made a checkpoint OCI
image with buildah and pushed to a local registry (Debian's ``docker-registry`` on
loopback), then deleted. Skipped, saying why, where buildah or the registry is
missing, or not as root (buildah's storage, like the kubelet's archives, is root's)."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import stat
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from shadowpod.kube import names
from shadowpod.kube.nodeagent import NodeAgent, NodeAgentConfig
from tests.kube.registry import local_registry

pytestmark = pytest.mark.timeout(60)
MISSING = [tool for tool in ("buildah", "docker-registry") if shutil.which(tool) is None]
if MISSING:
    pytestmark = [
        pytestmark,
        pytest.mark.skip(f"{' and '.join(MISSING)} not installed (apt-get install {MISSING[0]})"),
    ]
elif os.geteuid() != 0:
    pytestmark = [pytestmark, pytest.mark.skip("buildah's storage here needs root")]

STAMP = "2026-11-25T21:50:00Z"
MEMORY = b"sk-live-secret-token\x00" * 100  # what a memory page of the agent holds


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[str]:
    async with local_registry(tmp_path) as address:
        yield address


@pytest.fixture
async def readonly_registry(tmp_path: Path) -> AsyncIterator[str]:
    async with local_registry(tmp_path, readonly=True) as address:
        yield address


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    return directory


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "buildah"
    yield path
    shutil.rmtree(path, ignore_errors=True)  # vfs layers: nothing left in /tmp


def kubelet_archive(directory: Path, pod: str, container: str) -> Path:
    """An archive as the kubelet names it, with what CRI-O puts in one."""
    path = directory / f"checkpoint-{pod}_default-{container}-{STAMP}.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [
            ("spec.dump", b'{"ociVersion": "1.0.0"}'),
            ("config.dump", json.dumps({"name": container}).encode()),
            ("checkpoint/pages-1.img", MEMORY),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.chmod(0o644)  # as a careless runtime might leave it
    return path


async def _get(http: aiohttp.ClientSession, url: str, accept: str | None = None) -> bytes:
    headers = {"Accept": accept} if accept else {}
    async with http.get(url, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def test_an_agent_archive_becomes_a_pushed_checkpoint_image_and_is_deleted(
    registry: str, checkpoints: Path, storage: Path
) -> None:
    ours = kubelet_archive(checkpoints, "ada-7f3k2", "agent")
    theirs = kubelet_archive(checkpoints, "db-0", "postgres")  # someone else's forensics
    agent = NodeAgent(
        NodeAgentConfig(
            registry=f"{registry}/checkpoints",
            storage_dir=storage,
            checkpoints_dir=checkpoints,
            tls_verify=False,
            settle_s=1.0,
        )
    )
    # First seen: made root-only at once, imaged only once it has stopped growing.
    assert await agent.sweep(now=100.0) == []
    assert stat.S_IMODE(ours.stat().st_mode) == 0o600
    image = names.checkpoint_image(f"{registry}/checkpoints", str(ours))
    assert await agent.sweep(now=102.0) == [image]
    assert not ours.exists()
    assert theirs.exists() and stat.S_IMODE(theirs.stat().st_mode) == 0o644

    repository, tag = image.removeprefix(f"{registry}/").split(":")
    base = f"http://{registry}/v2/{repository}"
    async with aiohttp.ClientSession() as http:
        assert json.loads(await _get(http, f"{base}/tags/list"))["tags"] == [tag]
        manifest = json.loads(
            await _get(
                http, f"{base}/manifests/{tag}", "application/vnd.oci.image.manifest.v1+json"
            )
        )
        assert manifest["annotations"][names.CHECKPOINT_IMAGE_ANNOTATION] == "agent"
        [layer] = manifest["layers"]
        blob = await _get(http, f"{base}/blobs/{layer['digest']}")
    # The image holds the archive's contents, as CRI-O restores from them.
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        files = {m.name.lstrip("./"): m for m in tar.getmembers() if m.isfile()}
        assert {"spec.dump", "config.dump", "checkpoint/pages-1.img"} <= set(files)
        page = tar.extractfile(files["checkpoint/pages-1.img"])
        assert page is not None and page.read() == MEMORY
    # No local copy of the image is kept on the node.
    assert await agent._buildah("images", "--quiet") == ""


async def test_an_archive_that_cannot_be_pushed_is_deleted_after_its_attempts(
    readonly_registry: str, checkpoints: Path, storage: Path
) -> None:
    archive = kubelet_archive(checkpoints, "ada-7f3k2", "agent")
    agent = NodeAgent(
        NodeAgentConfig(
            registry=readonly_registry,
            storage_dir=storage,
            checkpoints_dir=checkpoints,
            tls_verify=False,
            settle_s=0.0,
            attempts=2,
            push_retries=0,
        )
    )
    assert await agent.sweep(now=1.0) == []
    assert archive.exists() and stat.S_IMODE(archive.stat().st_mode) == 0o600  # kept, root-only
    assert await agent.sweep(now=2.0) == []
    assert not archive.exists()  # it holds the agent's memory: not left behind
    assert await agent._buildah("images", "--quiet") == ""
