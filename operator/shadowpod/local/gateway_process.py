"""A gateway as a child process (``shadowpod gateway``), for local deployments and tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import aiohttp

from shadowpod.eventloop import EXIT_WITH_PARENT_ENV
from shadowpod.local.exits import exit_reason

READY_TIMEOUT_S: Final = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now. Bound as the gateway binds it
    (``SO_REUSEADDR``, asyncio's default): the connections a stopped gateway closed
    linger in TIME_WAIT on its port for a minute, and do not keep a server from it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


class GatewayProcess:
    """``start()`` launches and waits for ``/readyz``; ``stop()`` sends SIGTERM (or SIGKILL)."""

    def __init__(
        self,
        workdir: Path,
        *,
        journal_url: str | None = None,
        port: int | None = None,
        control_token: str | None = None,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        """``control_token``: replicas of one deployment share one; ``extra_args`` are
        passed on to ``shadowpod gateway``."""
        # Absolute: sqlite:/// + a relative path would name a file under the root.
        self.workdir = workdir.absolute()
        self.journal_url = journal_url or f"sqlite://{self.workdir / 'journal.db'}"
        self.host = host
        self.port = port or free_port(host)
        self.control_token = control_token or secrets.token_urlsafe(24)
        self.extra_args = tuple(extra_args)
        self.log = workdir / "gateway.log"
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        token_file = self.workdir / "control-token"
        token_file.write_text(self.control_token + "\n")
        token_file.chmod(0o600)
        with self.log.open("ab") as sink:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shadowpod", "gateway",
                "--journal", self.journal_url,
                "--host", self.host,
                "--port", str(self.port),
                "--control-token-file", str(token_file),
                # Every agent, shadow and load client of a local run connects from
                # this machine's address: a per-address limit would count them all.
                "--max-connections-per-peer", "0",
                *self.extra_args,
                env={**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        await self._wait_ready()

    async def _wait_ready(self) -> None:
        deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_S
        async with aiohttp.ClientSession() as http:
            while True:
                assert self.process is not None
                if self.process.returncode is not None:
                    # Its last line says why (``shadowpod gateway`` ends on one line).
                    raise RuntimeError(
                        f"the gateway {exit_reason(self.process.returncode, self.log)}"
                    )
                # A gateway slow to answer (starting on a busy machine) is asked again:
                # the probe's own timeout is not its failure.
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(
                        f"{self.url}/readyz", timeout=aiohttp.ClientTimeout(total=1)
                    ) as response:
                        if response.status == 200:
                            return
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"the gateway did not become ready; see {self.log}")
                await asyncio.sleep(0.05)

    async def stop(self, *, kill: bool = False) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout=10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
