"""Checkpoint images deleted from a real registry (Debian's ``docker-registry`` on
loopback) through the Docker Registry HTTP API v2, by the operator's client and by the
operator once a migration on the kubelet path has ended. Skipped, saying why, where
the registry is not installed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shadowpod.kube.registry import MANIFEST_TYPES, CheckpointImages, RegistryError
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.emulator.kubelets import CHECKPOINTS
from tests.kube.kubelet import Kubelet
from tests.kube.operator_world import World, world_of
from tests.kube.registry import MISSING_REGISTRY, local_registry, push_image
from tests.kube.support import eventually
from tests.kube.test_operator_criu import label_nodes, move, start_session

pytestmark = [pytest.mark.timeout(120)]
if MISSING_REGISTRY is not None:
    pytestmark.append(pytest.mark.skip(MISSING_REGISTRY))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def registry_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "registry"
    directory.mkdir()
    return directory


async def _status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.head(url, headers={"Accept": MANIFEST_TYPES}) as response:
        return response.status


async def test_a_checkpoint_image_is_deleted_by_digest(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with local_registry(tmp_path, deletable=True) as address:
        image = f"{address}/checkpoints/checkpoint:checkpoint-a1-0_default-agent-2026"
        digest = await push_image(http, address, image)
        kept = f"{address}/checkpoints/checkpoint:another-migration"
        await push_image(http, address, kept, pages=b"another agent's memory")
        base = f"http://{address}/v2/checkpoints/checkpoint/manifests"
        assert await _status(http, f"{base}/{digest}") == 200
        images = CheckpointImages(http, insecure=True)
        assert await images.delete(image) is True
        assert await _status(http, f"{base}/checkpoint-a1-0_default-agent-2026") == 404
        assert await _status(http, f"{base}/{digest}") == 404
        assert await _status(http, f"{base}/another-migration") == 200  # only that one
        assert await images.delete(image) is False  # gone: nothing to do, no error


async def test_a_registry_that_refuses_deletes_says_how_to_allow_them(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with local_registry(tmp_path) as address:  # Distribution's default: no deletes
        image = f"{address}/checkpoints/checkpoint:t1"
        await push_image(http, address, image)
        with pytest.raises(RegistryError, match=r"405.*storage.delete.enabled: true"):
            await CheckpointImages(http, insecure=True).delete(image)
        base = f"http://{address}/v2/checkpoints/checkpoint/manifests"
        assert await _status(http, f"{base}/t1") == 200


@pytest.mark.parametrize("deletable", [True, False], ids=["deletes", "refuses-deletes"])
async def test_the_operator_deletes_the_checkpoint_image_when_the_migration_ends(
    emulator: ApiServerEmulator,
    emulator_kube: KubeConnection,
    kubelet: Kubelet,
    tmp_path: Path,
    registry_dir: Path,
    http: aiohttp.ClientSession,
    deletable: bool,
) -> None:
    """The kubelet path: the node agent's push is played by the test once the shadow pod
    names its image; the stand-in cannot run a checkpoint image, so the migration rolls
    back at the phase timeout — and the image is deleted (a registry that refuses is
    a Warning event, the migration rolled back all the same)."""
    await kubelet.add_node("node-2")
    async with local_registry(registry_dir, deletable=deletable) as address:
        async for world in world_of(emulator_kube, "default", tmp_path):
            world.criu = True
            world.checkpoint_registry = f"{address}/checkpoints"
            world.checkpoint_registry_insecure = True
            await world.start_operator()
            image = await _one_migration_rolled_back(world, emulator, http, address)
            repository, _, tag = image.removeprefix(f"{address}/").rpartition(":")
            left = await _status(http, f"http://{address}/v2/{repository}/manifests/{tag}")
            events = await world.events("move-g1")
            warned = [m for t, r, m in events if (t, r) == ("Warning", "CheckpointImageNotDeleted")]
            if deletable:
                assert left == 404
                assert warned == []
            else:
                assert left == 200
                assert warned and image in warned[0] and "storage.delete.enabled" in warned[0]


async def _one_migration_rolled_back(
    world: World, emulator: ApiServerEmulator, http: aiohttp.ClientSession, address: str
) -> str:
    source, here, there = await start_session(world, "g1", phaseTimeoutSeconds=4)
    await label_nodes(world, here, there)
    emulator.kubelet_checkpoints[here] = CHECKPOINTS
    await world.apply(move("move-g1", "g1", there, strategy="CRIU"))

    async def shadow() -> dict[str, Any] | None:
        pods = [p for p in await world.pods("g1") if p["metadata"]["name"] != source]
        return pods[0] if pods else None

    pod = await eventually(shadow, timeout=30)
    image = str(pod["spec"]["containers"][0]["image"])
    await push_image(http, address, image)  # as the node agent does
    status = (await world.wait_finished("move-g1"))["status"]
    assert (status["result"], status["checkpointMechanism"]) == ("RolledBack", "KubeletAPI")
    return image
