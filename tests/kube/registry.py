"""Debian's ``docker-registry`` (Distribution) on a loopback port, for tests that push
to and delete from a real registry; and a minimal image pushed through its API."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.kube.support import eventually

MISSING_REGISTRY = (
    None
    if shutil.which("docker-registry")
    else "Debian's docker-registry is not installed (apt-get install docker-registry)"
)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def local_registry(
    directory: Path, *, readonly: bool = False, deletable: bool = False
) -> AsyncIterator[str]:
    """Debian's docker-registry on a loopback port; its ``host:port``. Read-only, it
    refuses every push at once (405), as a registry the node may not write to;
    ``deletable``, it deletes manifests (``storage.delete.enabled``)."""
    address = f"127.0.0.1:{_free_port()}"
    config = directory / "registry.yml"
    maintenance = "  maintenance:\n    readonly:\n      enabled: true\n" if readonly else ""
    if deletable:
        maintenance += "  delete:\n    enabled: true\n"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {directory / 'registry'}\n{maintenance}"
        f"http:\n  addr: {address}\n"
        "log:\n  level: error\n"
    )
    process = await asyncio.create_subprocess_exec(
        "docker-registry",
        "serve",
        str(config),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def up() -> bool:
                try:
                    async with http.get(f"http://{address}/v2/") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(up, timeout=15, every=0.1)
        yield address
    finally:
        process.terminate()
        await process.wait()


async def push_image(
    http: aiohttp.ClientSession,
    address: str,
    image: str,
    pages: bytes = b"checkpoint pages: every memory page of the agent",
) -> str:
    """A one-layer OCI image (its layer ``pages``) pushed as ``image`` (``address/
    repository:tag``) through the registry's API; its manifest's digest."""
    repository, _, tag = image.removeprefix(f"{address}/").rpartition(":")
    base = f"http://{address}/v2/{repository}"

    async def blob(data: bytes) -> str:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        async with http.post(f"{base}/blobs/uploads/") as started:
            assert started.status == 202, await started.text()
            location = started.headers["Location"]
        joiner = "&" if "?" in location else "?"
        url = location if location.startswith("http") else f"http://{address}{location}"
        async with http.put(f"{url}{joiner}digest={digest}", data=data) as done:
            assert done.status == 201, await done.text()
        return digest

    layer = pages
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {}}).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": await blob(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": await blob(layer),
                    "size": len(layer),
                }
            ],
        }
    ).encode()
    headers = {"Content-Type": OCI_MANIFEST}
    async with http.put(f"{base}/manifests/{tag}", data=manifest, headers=headers) as put:
        assert put.status == 201, await put.text()
        return put.headers["Docker-Content-Digest"]
