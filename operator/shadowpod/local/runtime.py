"""``LocalRuntime``: agent instances as local processes, each on its own 127.0.0.x.

Like a pod, every instance gets its own address (the same port on a different
loopback IP), its own identity files and its own log. The runtime implements the
engine's ``Runtime`` port.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp

from shadowpod.agent.identity import Identity
from shadowpod.engine.ports import ImageInfo, InstanceSpec, InstanceStatus
from shadowpod.local.images import ImageMap

AGENT_PORT: Final = 8080
STATUS_TIMEOUT: Final = aiohttp.ClientTimeout(total=1.0)


@dataclass
class LocalInstance:
    spec: InstanceSpec
    host: str
    process: asyncio.subprocess.Process
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{AGENT_PORT}"


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class LocalRuntime:
    def __init__(
        self,
        images: ImageMap,
        *,
        gateway_url: str,
        workdir: Path,
        credentials_dir: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.images = images
        self.gateway_url = gateway_url
        self.workdir = workdir
        self.credentials_dir = credentials_dir or workdir / "credentials"
        self._env = env or {}
        self._tokens: dict[str, str] = {}
        self._instances: dict[str, LocalInstance] = {}
        # A random /16 inside 127.0.0.0/8 per runtime, so that several local
        # deployments on one machine (parallel test runs, a demo) do not collide.
        base = random.randrange(1, 255)
        self._hosts = itertools.cycle(
            f"127.{base}.{b}.{c}" for b in range(4) for c in range(2, 255)
        )
        self._http: aiohttp.ClientSession | None = None

    def register_session(self, session: str, agent_token: str) -> None:
        """The agent token instances of ``session`` present (given once at creation)."""
        self._tokens[session] = agent_token

    def instance(self, name: str) -> LocalInstance | None:
        return self._instances.get(name)

    async def close(self) -> None:
        for name in list(self._instances):
            await self.stop(name, grace_s=2.0)
        if self._http is not None:
            await self._http.close()

    # --- the Runtime port -------------------------------------------------------------

    async def describe(self, image: str) -> ImageInfo:
        return self.images.resolve(image).info(image)

    async def missing_credentials(self, image: str, names: list[str]) -> list[str]:
        self.images.resolve(image)
        return [name for name in names if not (self.credentials_dir / name).is_file()]

    async def start(self, spec: InstanceSpec) -> None:
        image = self.images.resolve(spec.image)
        running = self._instances.get(spec.name)
        if running is not None and running.process.returncode is None:
            raise RuntimeError(f"instance {spec.name!r} is already running")
        if spec.session not in self._tokens:
            raise KeyError(f"no agent token registered for session {spec.session!r}")
        home = self.workdir / "instances" / spec.name
        Identity.write(
            home / "identity",
            session=spec.session,
            instance=spec.name,
            gateway=self.gateway_url,
            token=self._tokens[spec.session],
        )
        host = self._allocate_host()
        env = {
            **os.environ,
            **image.env,
            **self._env,
            "SHADOWPOD_IDENTITY_DIR": str(home / "identity"),
            "SHADOWPOD_MODE": spec.mode,
            "SHADOWPOD_LISTEN": f"{host}:{AGENT_PORT}",
            "SHADOWPOD_CREDENTIALS_DIR": str(self.credentials_dir),
        }
        for key, value in (("SHADOWPOD_EPOCH", spec.epoch), ("SHADOWPOD_SNAPSHOT", spec.snapshot)):
            if value is not None:
                env[key] = str(value)
        log = home / "agent.log"
        with log.open("ab") as sink:
            process = await asyncio.create_subprocess_exec(
                *image.command,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        self._instances[spec.name] = LocalInstance(spec, host, process, log)

    async def status(self, name: str) -> InstanceStatus:
        instance = self._instances.get(name)
        if instance is None:
            return InstanceStatus(name=name, alive=False, error="never started here")
        if instance.process.returncode is not None:
            return InstanceStatus(
                name=name, alive=False, error=f"exited with code {instance.process.returncode}"
            )
        try:
            async with self.http.get(
                f"{instance.url}/v1/status", timeout=STATUS_TIMEOUT
            ) as response:
                data = await response.json()
        except (aiohttp.ClientError, TimeoutError):
            return InstanceStatus(name=name, alive=True)  # starting up: not answering yet
        catchup = data.get("catchup") or {}
        promotion = data.get("promotion") or {}
        return InstanceStatus(
            name=name,
            alive=instance.process.returncode is None,
            ready=bool(data.get("ready")),
            mode=data.get("mode", "unknown"),
            epoch=data.get("epoch", 0),
            watermark=data.get("watermark", 0),
            catchup_entries=catchup.get("entries"),
            catchup_entries_per_s=catchup.get("entries_per_s"),
            promoted_fence_seq=promotion.get("fence_seq"),
            error=data.get("error"),
        )

    async def promoted_state_digest(self, name: str) -> tuple[int, str] | None:
        """(fence_seq, digest of the state there) of an instance promoted from a shadow.

        Not part of the engine's port: a check for tests and benchmarks. The instance
        hashes its state on this request, so ask after the cutover, not during it.
        """
        instance = self._instances.get(name)
        if instance is None or instance.process.returncode is not None:
            return None
        try:
            async with self.http.get(
                f"{instance.url}/v1/promotion", timeout=aiohttp.ClientTimeout(total=30)
            ) as response:
                if response.status != 200:
                    return None
                data = await response.json()
        except (aiohttp.ClientError, TimeoutError):
            return None
        return int(data["fence_seq"]), str(data["state_digest"])

    async def stop(self, name: str, *, grace_s: float) -> None:
        """SIGTERM (the agent drains its background work), then after ``grace_s``
        SIGKILL for the agent and anything it left behind, as a pod deletion does."""
        instance = self._instances.get(name)
        if instance is None or instance.process.returncode is not None:
            return
        _signal(instance.process, signal.SIGTERM)
        try:
            await asyncio.wait_for(instance.process.wait(), timeout=grace_s)
        except TimeoutError:
            await self.kill(name)

    async def kill(self, name: str) -> None:
        """SIGKILL the instance and all its descendants at once: a crash (a pod's
        processes die with it), for tests and chaos drills."""
        instance = self._instances.get(name)
        if instance is None or instance.process.returncode is not None:
            return
        family = _descendants(instance.process.pid)  # before the parent goes
        _signal(instance.process, signal.SIGKILL)
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await instance.process.wait()

    # --- internals --------------------------------------------------------------------

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    def _allocate_host(self) -> str:
        in_use = {i.host for i in self._instances.values() if i.process.returncode is None}
        for _ in range(4 * 253):
            host = next(self._hosts)
            if host not in in_use and _free(host, AGENT_PORT):
                return host
        raise RuntimeError("no free 127.0.x.y address for another local agent instance")


def _descendants(root: int) -> list[int]:
    """Every process below ``root``, found through /proc (children in other process
    groups and sessions included: background processes start their own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(process: asyncio.subprocess.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
