"""``LocalRuntime``: agent instances as local processes, each on its own 127.0.0.x.

Like a pod, every instance gets its own address (the same port on a different
loopback IP), its own identity files and its own log. The runtime implements the
engine's ``Runtime`` port.

With ``warm_spares``, the runtime keeps a pre-started agent process of the image it
started last (see ``shadowpod.agent.main``): the next migration to that image then
skips the interpreter start and the agent's imports, about half a second of CPU on
the cores that serve while it runs. The spare is made when an instance exits — at
the end of a migration, not inside the next one — so the first start of an image is
a cold one. Both strategies use it, so the restart baseline gains as much.

When an instance dies, whatever it left running is killed and, if it was an owner
with background processes, what became of them is journaled on its behalf (see
``shadowpod.local.orphans``); its status says what was killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import signal
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp

from shadowpod.agent.identity import Identity, SessionIdentity
from shadowpod.agent.processes import ProcessInventory
from shadowpod.agent.settings import DESCRIBE_ENV
from shadowpod.agent.termination import TERMINATION_LOG_ENV
from shadowpod.api.models import DrainReport
from shadowpod.client.agent import instance_status, read_agent_status
from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.engine.ports import (
    ImageInfo,
    InstanceSpec,
    InstanceStatus,
    RuntimeFailure,
)
from shadowpod.eventloop import EXIT_WITH_PARENT_ENV
from shadowpod.local.exits import TERMINATION_LOG, exit_reason
from shadowpod.local.images import (
    DescribedImages,
    ImageMap,
    LocalImage,
    default_described_dir,
)
from shadowpod.local.orphans import INVENTORY_ENV, TAG_ENV, Reaped, drain_report, kill_tagged
from shadowpod.sessions.tokens import owner_credential

logger = logging.getLogger(__name__)
AGENT_PORT: Final = 8080
# How long a drain report on a dead owner's behalf is retried while the gateway is away.
REPORT_RETRY_S: Final = 15.0
REPORT_CLOSE_S: Final = 2.0
# An agent's imports (a framework's) may take seconds on a busy machine.
DESCRIBE_TIMEOUT_S: Final = 60.0


@dataclass
class LocalInstance:
    spec: InstanceSpec
    host: str
    process: asyncio.subprocess.Process
    log: Path
    tag: str  # in the environment of every process of this instance
    inventory: Path
    reaping: asyncio.Task[Reaped] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{AGENT_PORT}"


@dataclass
class WarmSpare:
    """A pre-started agent process of ``image``, waiting for its instance's environment."""

    image: str
    process: asyncio.subprocess.Process
    log: Path


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _host_run(start: int, count: int = 4 * 253) -> list[str]:
    """``count`` loopback addresses from ``start`` (the address's low 24 bits), none
    ending in .0, .1 or .255."""
    hosts: list[str] = []
    n = start
    while len(hosts) < count:
        a, b, c = (n >> 16) & 255, (n >> 8) & 255, n & 255
        if 1 <= a <= 254 and 2 <= c <= 254:
            hosts.append(f"127.{a}.{b}.{c}")
        n += 1
    return hosts


class LocalRuntime:
    def __init__(
        self,
        images: ImageMap,
        *,
        gateway_url: str,
        workdir: Path,
        credentials_dir: Path | None = None,
        env: dict[str, str] | None = None,
        warm_spares: bool = False,
        described: DescribedImages | None = None,
    ) -> None:
        """``described``: where what images' code said is kept across runtimes (by
        default the user's cache, ``images.default_described_dir``)."""
        self.images = images
        self.described = described or DescribedImages(default_described_dir())
        self.gateway_url = gateway_url
        self.workdir = workdir
        self.credentials_dir = credentials_dir or workdir / "credentials"
        self._env = env or {}
        self._tokens: dict[str, str] = {}
        self._owner_keys: dict[str, str] = {}  # session -> its owner key
        self._instances: dict[str, LocalInstance] = {}
        # A run of addresses from a random start in 127.1.0.0 - 127.254.255.255 per
        # runtime, so that several local deployments on one machine (parallel test
        # runs, a demo) do not collide: a random /16 each (254 of them) met often
        # enough under parallel tests that two runtimes started agents on one address.
        self._hosts = itertools.cycle(_host_run(random.randrange(1 << 16, 254 << 16)))
        self._http: aiohttp.ClientSession | None = None
        self.warm_spares = warm_spares
        self._spares: dict[str, WarmSpare] = {}
        self._spare_names = itertools.count(1)
        self._last_image: str | None = None  # of the last start: the next one's likely
        self._watchers: set[asyncio.Task[None]] = set()
        self._making_spare = asyncio.Lock()
        self._reports: set[asyncio.Task[None]] = set()
        self._described: dict[str, ImageInfo] = {}  # what images' code said
        self._identities: dict[str, SessionIdentity] = {}

    def register_session(
        self,
        session: str,
        agent_token: str,
        identity: SessionIdentity | None = None,
        owner_key: str | None = None,
    ) -> None:
        """The agent token instances of ``session`` present (given once at creation),
        the session's identity, given to every instance as files, and its owner key
        (the session was created with it), from which each instance's owner credential
        is derived here: starting an instance never needs the gateway up."""
        self._tokens[session] = agent_token
        if identity is not None:
            self._identities[session] = identity
        if owner_key is not None:
            self._owner_keys[session] = owner_key

    def owner_credential(self, session: str, instance: str) -> str | None:
        """The instance's owner credential (``None``: the session has none)."""
        owner_key = self._owner_keys.get(session)
        if owner_key is None:
            return None
        return owner_credential(owner_key, session, instance)

    def instance(self, name: str) -> LocalInstance | None:
        return self._instances.get(name)

    def instances(self) -> list[LocalInstance]:
        """Every instance started here, running or ended (the last of each name)."""
        return list(self._instances.values())

    def spare(self, image: str) -> WarmSpare | None:
        """The warm spare waiting to become the next instance of ``image``, if any."""
        return self._spares.get(image)

    async def close(self) -> None:
        self.warm_spares = False  # none made while stopping
        async with self._making_spare:  # one being started is then in _spares, to dismiss
            for watcher in list(self._watchers):
                watcher.cancel()
        for name in list(self._instances):
            await self.stop(name, grace_s=2.0)
        for spare in list(self._spares.values()):
            await _dismiss(spare)
        self._spares.clear()
        reaping = [i.reaping for i in self._instances.values() if i.reaping is not None]
        await asyncio.gather(*reaping, return_exceptions=True)
        if self._reports:  # a little while, for a gateway that is there
            _, late = await asyncio.wait(list(self._reports), timeout=REPORT_CLOSE_S)
            for task in late:
                task.cancel()
        if self._http is not None:
            await self._http.close()

    # --- the Runtime port -------------------------------------------------------------

    async def describe(self, image: str) -> ImageInfo:
        """What the image map declares of ``image``, or else what its code says."""
        local = self.images.resolve(image)
        declared = local.info(image)
        if declared is not None:
            return declared
        if image not in self._described:
            digest = local.digest()
            known = self.described.get(image, digest)
            if known is None:
                known = await self._ask_code(image, local)
                self.described.put(digest, known)
            self._described[image] = known
        return self._described[image]

    async def _ask_code(self, image: str, local: LocalImage) -> ImageInfo:
        process = await asyncio.create_subprocess_exec(
            *local.command,
            env={**self._image_env(local), DESCRIBE_ENV: "1"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), DESCRIBE_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuntimeFailure(
                f"image {image!r} did not say its state schema within {DESCRIBE_TIMEOUT_S:g} s "
                f"(its command run with {DESCRIBE_ENV}=1); declare state_schema and "
                "reads_state_schemas for it in the image map"
            ) from None
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            if process.returncode != 0 or not lines:
                raise ValueError(f"exit code {process.returncode}")
            said = json.loads(lines[-1])
            return ImageInfo(
                image=image,
                state_schema=said["state_schema"],
                reads_state_schemas=sorted(said["reads_state_schemas"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            why = (err.decode(errors="replace").strip().splitlines() or [str(exc)])[-1]
            raise RuntimeFailure(
                f"image {image!r} could not say its state schema (its command run with "
                f"{DESCRIBE_ENV}=1: {why}); is it a Shadowpod agent? Or declare "
                "state_schema and reads_state_schemas for it in the image map"
            ) from None

    async def missing_credentials(self, image: str, names: list[str]) -> list[str]:
        self.images.resolve(image)
        return [name for name in names if not (self.credentials_dir / name).is_file()]

    async def start(self, spec: InstanceSpec) -> None:
        image = self.images.resolve(spec.image)
        running = self._instances.get(spec.name)
        if running is not None and running.process.returncode is None:
            if running.spec != spec:
                raise RuntimeFailure(
                    f"instance {spec.name!r} is already running as {running.spec}, not {spec}"
                )
            return  # asked again (a retried step): it is running
        if running is not None and running.reaping is not None:
            await running.reaping  # what it left behind goes before anything new starts
        if spec.session not in self._tokens:
            raise RuntimeFailure(f"no agent token registered for session {spec.session!r}")
        home = self.workdir / "instances" / spec.name
        persona = self._identities.get(spec.session)
        Identity.write(
            home / "identity",
            session=spec.session,
            instance=spec.name,
            gateway=self.gateway_url,
            token=self._tokens[spec.session],
            owner_credential=self.owner_credential(spec.session, spec.name),
            agent_name=None if persona is None else persona.name,
            principles=None if persona is None else persona.principles,
        )
        host = self._allocate_host()
        tag = uuid.uuid4().hex
        inventory = home / f"processes-{tag[:12]}.json"
        instance_env = {
            "SHADOWPOD_IDENTITY_DIR": str(home / "identity"),
            "SHADOWPOD_MODE": spec.mode,
            "SHADOWPOD_LISTEN": f"{host}:{AGENT_PORT}",
            "SHADOWPOD_CREDENTIALS_DIR": str(self.credentials_dir),
            TAG_ENV: tag,
            INVENTORY_ENV: str(inventory),
        }
        for key, value in (("SHADOWPOD_EPOCH", spec.epoch), ("SHADOWPOD_SNAPSHOT", spec.snapshot)):
            if value is not None:
                instance_env[key] = str(value)
        # Where the agent writes why it stopped (a pod's terminationMessagePath); a
        # restarted instance must not inherit the previous one's.
        termination_log = home / TERMINATION_LOG
        termination_log.unlink(missing_ok=True)
        instance_env[TERMINATION_LOG_ENV] = str(termination_log)
        log = home / "agent.log"
        spare = self._spares.pop(spec.image, None)
        process = None if spare is None else await _activate(spare, instance_env)
        if spare is not None and process is not None:
            if log.exists():  # a restarted instance: keep both logs, side by side
                log = log.with_name(f"agent.{spare.log.stem}.log")
            spare.log.rename(log)  # the process keeps writing to it
        else:
            with log.open("ab") as sink:
                process = await asyncio.create_subprocess_exec(
                    *image.command,
                    env={**self._image_env(image), **instance_env},
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=sink,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
        self._last_image = spec.image
        if self.warm_spares:
            watcher = asyncio.create_task(self._spare_after_exit(process))
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)
        instance = LocalInstance(spec, host, process, log, tag, inventory)
        instance.reaping = asyncio.create_task(self._reap(instance), name=f"reap-{spec.name}")
        self._instances[spec.name] = instance

    async def status(self, name: str) -> InstanceStatus:
        instance = self._instances.get(name)
        if instance is None:
            return InstanceStatus(name=name, alive=False, error="never started here")
        if (code := instance.process.returncode) is not None:
            reaped = Reaped() if instance.reaping is None else await instance.reaping
            return InstanceStatus(
                name=name,
                alive=False,
                # It ended by itself (a fatal error: >0; or stopped: 0), or a signal
                # ended it: a crash, which a new instance recovers from.
                mode="failed" if code > 0 else "stopped" if code == 0 else "crashed",
                error=exit_reason(code, instance.log),
                left_behind=reaped.summary(),
            )
        reported = await read_agent_status(self.http, instance.url)
        if instance.process.returncode is not None:
            return await self.status(name)  # it ended while it was asked: how it ended
        return instance_status(name, reported)

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
        if instance is not None and instance.process.returncode is None:
            _signal(instance.process, signal.SIGTERM)
            try:
                await asyncio.wait_for(instance.process.wait(), timeout=grace_s)
            except TimeoutError:
                await self.kill(name)

    async def _spare_after_exit(self, process: asyncio.subprocess.Process) -> None:
        # An instance exits at the end of a migration (a drained source leaves on its
        # own): the spare's start then falls between migrations, not inside one.
        await process.wait()
        async with self._making_spare:
            await self._make_spare()

    async def _make_spare(self) -> None:
        """A warm spare of the image started last, unless one is waiting already."""
        name = self._last_image
        if not self.warm_spares or name is None:
            return
        spare = self._spares.get(name)
        if spare is None or spare.process.returncode is not None:
            image = self.images.resolve(name)
            log = self.workdir / "spares" / f"spare-{next(self._spare_names)}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as sink:
                process = await asyncio.create_subprocess_exec(
                    *image.command,
                    env={**self._image_env(image), "SHADOWPOD_WARM": "1"},
                    stdin=asyncio.subprocess.PIPE,
                    stdout=sink,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            self._spares[name] = WarmSpare(name, process, log)

    def _image_env(self, image: LocalImage) -> dict[str, str]:
        # Agents die with the process that runs this runtime (see eventloop.exit_with_parent).
        parent = {EXIT_WITH_PARENT_ENV: str(os.getpid())}
        return {**os.environ, **image.env, **self._env, **parent}

    async def kill(self, name: str) -> None:
        """SIGKILL the instance and everything it started at once: a crash (a pod's
        processes die with it), for tests and chaos drills."""
        instance = self._instances.get(name)
        if instance is None or instance.process.returncode is not None:
            return
        _signal(instance.process, signal.SIGKILL)
        await asyncio.to_thread(kill_tagged, instance.tag)
        await instance.process.wait()

    async def _reap(self, instance: LocalInstance) -> Reaped:
        """Once the instance's process has exited: kill what it left running, and
        journal what became of its background processes on its behalf."""
        code = await instance.process.wait()
        try:
            killed = await asyncio.to_thread(kill_tagged, instance.tag)
        except OSError as exc:  # no /proc: nothing found, nothing killed
            logger.error("could not look for what %s left running: %s", instance.spec.name, exc)
            killed = []
        inventory = ProcessInventory.read(instance.inventory)
        report = drain_report(instance.spec.name, inventory, code)
        reaped = Reaped(killed, report)
        if killed or report is not None:
            logger.warning(
                "instance %s exited with code %s; after it: %s",
                instance.spec.name,
                instance.process.returncode,
                "; ".join(reaped.summary()),
            )
        if report is not None:
            task = asyncio.create_task(self._report(instance.spec.session, report))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)
        return reaped

    async def _report(self, session: str, report: DrainReport) -> None:
        """Send a drain report for a dead owner (ids derived from owner, epoch and
        process: one it sent itself before dying is not doubled)."""
        token = self._tokens.get(session)
        deadline = asyncio.get_running_loop().time() + REPORT_RETRY_S
        credential = self.owner_credential(session, report.instance)
        owner = None if credential is None else (report.instance, credential)
        async with GatewayClient(self.gateway_url, token, owner=owner) as client:
            while True:
                try:
                    await client.drained(session, report)
                    return
                except (aiohttp.ClientError, TimeoutError, GatewayError) as exc:
                    if asyncio.get_running_loop().time() > deadline or (
                        isinstance(exc, GatewayError) and exc.status < 500
                    ):
                        logger.error(
                            "could not journal what instance %s left behind: %s",
                            report.instance,
                            exc,
                        )
                        return
                await asyncio.sleep(0.25)

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
        raise RuntimeFailure("no free 127.0.x.y address for another local agent instance")


async def _activate(spare: WarmSpare, env: dict[str, str]) -> asyncio.subprocess.Process | None:
    """Hand a spare its instance's environment; ``None`` if it is gone."""
    stdin = spare.process.stdin
    if spare.process.returncode is not None or stdin is None:
        return None
    try:
        stdin.write(json.dumps(env).encode() + b"\n")
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        return None
    return spare.process


async def _dismiss(spare: WarmSpare) -> None:
    """A spare nobody needs: closing its stdin makes it exit; SIGKILL if it lingers."""
    if spare.process.stdin is not None:
        spare.process.stdin.close()
    try:
        await asyncio.wait_for(spare.process.wait(), timeout=5)
    except TimeoutError:
        _signal(spare.process, signal.SIGKILL)
        await spare.process.wait()


def _signal(process: asyncio.subprocess.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
