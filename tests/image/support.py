"""What the image tests share: loopback addresses, files a container's user can read,
waiting for a container to answer, the gateway container."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp
import pytest

from tests.image.docker import Container

READY_TIMEOUT_S: Final = 60.0


def loopback_address() -> tuple[str, int]:
    """A random 127.x.y.z with a free port: containers share the host's network, and
    other test runs on this machine use loopback addresses too."""
    for _ in range(100):
        host = (
            f"127.{random.randrange(1, 255)}.{random.randrange(0, 256)}.{random.randrange(2, 255)}"
        )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, 0))
            except OSError:
                continue
            port: int = probe.getsockname()[1]
            return host, port
    raise RuntimeError("no free loopback address found")


def shared_with_container(path: Path, *, writable: bool = False) -> Path:
    """Make ``path`` (a directory, and the files in it) usable by the image's user, as a
    volume's ``fsGroup`` or ``defaultMode`` would in a pod."""
    for item in [path, *path.rglob("*")]:
        if os.geteuid() == 0:
            os.chown(item, 65532, 65532)
        elif item.is_dir():
            item.chmod(0o777 if writable else 0o755)
        else:
            item.chmod(0o666 if writable else 0o644)
    return path


async def wait_ready(url: str, container: Container, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until ``url`` answers 200; fails at once, with its logs, if the container exits."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while asyncio.get_running_loop().time() < deadline:
            code = await container.exit_code()
            if code is not None:
                pytest.fail(
                    f"container {container.name} exited with {code} before {url} answered:\n"
                    f"{await container.logs()}"
                )
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
                    last = f"{response.status}: {await response.text()}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
    pytest.fail(f"{url} did not answer 200 within {timeout_s} s (last: {last})")


@dataclass(frozen=True)
class GatewayContainer:
    url: str
    control_token: str
    container: Container
    journal_dir: Path
