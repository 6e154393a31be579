"""``CriuRuntime``: the local runtime, with CRIU checkpoints (the engine's ``Checkpointer``).

A checkpoint of an instance is taken while it serves: the agent forks a stopped copy
of itself between two turns (``POST /v1/checkpoint``, see
``shadowpod.agent.checkpoint``) and ``criu dump`` takes that copy — the agent is
never frozen. The checkpoint is a directory under ``WORKDIR/checkpoints``, mode 0700:
it holds every memory page of the agent, its credentials too.

A restore starts an instance as ``shadowpod.local.criu_restore`` in a pid and mount
namespace of its own, where the new instance's identity directory (with the place's
environment: its address, its process inventory) is mounted over the path the
checkpointed process reads its identity from. The checkpoint is deleted once
restored or discarded.

Needs CRIU 4 (``criu`` on the PATH), root, ``unshare`` and ``mount``, and the rights
CRIU asks for (in a container: ``--cap-add ALL --cap-drop SYS_RESOURCE --security-opt
seccomp=unconfined --security-opt systempaths=unconfined``); agents run on asyncio's
own event loop (set here). See docs/criu.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Final

import aiohttp
from pydantic import ValidationError

from shadowpod.agent.identity import Identity
from shadowpod.agent.termination import TERMINATION_LOG_ENV
from shadowpod.api.agent import CheckpointReport, CheckpointRequest
from shadowpod.engine.ports import (
    Checkpoint,
    CheckpointRestoreUnsupported,
    InstanceSpec,
    RuntimeFailure,
    RuntimeUnavailable,
)
from shadowpod.eventloop import EVENT_LOOP_ENV
from shadowpod.local.exits import TERMINATION_LOG
from shadowpod.local.images import ImageMap
from shadowpod.local.orphans import INVENTORY_ENV, TAG_ENV
from shadowpod.local.runtime import AGENT_PORT, LocalInstance, LocalRuntime

CHECKPOINT_TIMEOUT: Final = aiohttp.ClientTimeout(total=30)
STOPPED_WAIT_S: Final = 10.0
DUMP_TIMEOUT_S: Final = 600.0
META: Final = "shadowpod-checkpoint.json"


def criu_unavailable(criu: str = "criu") -> str | None:
    """Why CRIU cannot run here (no binary, one older than 4, not root), or ``None``."""
    if shutil.which(criu) is None:
        return f"no {criu} here: CRIU 4 is needed (Debian trixie's criu package)"
    version = criu_version(criu)
    if not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 4:
        return (
            f"criu {version} here: CRIU 4 is needed (3.x fails on current kernels); "
            "run in the CRIU image (hack/image-criu, docs/criu.md)"
        )
    if os.geteuid() != 0:
        return "CRIU runs as root here (checkpoint and restore need CAP_SYS_ADMIN and more)"
    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            return f"no {tool} here (util-linux): restores need it"
    return None


def criu_version(criu: str = "criu") -> str:
    """``criu --version``'s number (``4.1.1``), or what it said instead."""
    try:
        done = subprocess.run([criu, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"unknown ({exc})"
    for line in done.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


class CriuRuntime(LocalRuntime):
    def __init__(
        self,
        images: ImageMap,
        *,
        gateway_url: str,
        workdir: Path,
        credentials_dir: Path | None = None,
        env: dict[str, str] | None = None,
        criu: str = "criu",
    ) -> None:
        super().__init__(
            images,
            gateway_url=gateway_url,
            workdir=workdir,
            credentials_dir=credentials_dir,
            env={**(env or {}), EVENT_LOOP_ENV: "asyncio"},
        )
        self.criu = criu
        self.checkpoints = workdir / "checkpoints"

    async def close(self) -> None:
        await super().close()
        shutil.rmtree(self.checkpoints, ignore_errors=True)  # never left behind

    # --- the Checkpointer port --------------------------------------------------------

    async def checkpoint(self, source: str, target: str) -> Checkpoint:
        if reason := criu_unavailable(self.criu):
            raise CheckpointRestoreUnsupported(reason)
        instance = self.instance(source)
        if instance is None or instance.process.returncode is not None:
            raise RuntimeFailure(f"instance {source!r} is not running: nothing to checkpoint")
        started = time.monotonic()
        home = self.workdir / "instances" / target
        home.mkdir(parents=True, exist_ok=True)
        output = home / "agent.log"
        taken = await self._fork(instance, output)
        directory = self.checkpoints / f"{source}-{uuid.uuid4().hex[:8]}"
        directory.mkdir(parents=True, mode=0o700)
        directory.chmod(0o700)  # every memory page of the agent: root's only
        try:
            await _stopped(taken.pid)
            await self._dump(taken.pid, directory)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.kill(taken.pid, signal.SIGKILL)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        meta = {
            "source": source,
            "identity_dir": str(self.workdir / "instances" / source / "identity"),
            "watermark": taken.watermark,
        }
        (directory / META).write_text(json.dumps(meta))
        size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
        return Checkpoint(
            ref=str(directory),
            watermark=taken.watermark,
            dump_ms=round((time.monotonic() - started) * 1000, 3),
            bytes=size,
        )

    async def restore(self, checkpoint: str, spec: InstanceSpec) -> None:
        running = self.instance(spec.name)
        if running is not None and running.process.returncode is None:
            return  # asked again (a retried step): it is running
        directory = Path(checkpoint)
        try:
            meta = json.loads((directory / META).read_text())
        except (OSError, ValueError) as exc:
            raise RuntimeFailure(f"no usable checkpoint at {directory}: {exc}") from None
        token = self._tokens.get(spec.session)
        if token is None:
            raise RuntimeFailure(f"no agent token registered for session {spec.session!r}")
        home = self.workdir / "instances" / spec.name
        host = self._allocate_host()
        tag = uuid.uuid4().hex
        inventory = home / f"processes-{tag[:12]}.json"
        termination_log = home / TERMINATION_LOG
        termination_log.unlink(missing_ok=True)
        Identity.write(
            home / "identity",
            session=spec.session,
            instance=spec.name,
            gateway=self.gateway_url,
            token=token,
            owner_credential=self.owner_credential(spec.session, spec.name),
            environment={
                "SHADOWPOD_MODE": "shadow",
                "SHADOWPOD_LISTEN": f"{host}:{AGENT_PORT}",
                TAG_ENV: tag,
                INVENTORY_ENV: str(inventory),
                TERMINATION_LOG_ENV: str(termination_log),
            },
        )
        command = ["unshare", "--pid", "--mount", "--fork", "--mount-proc"]
        command += [sys.executable, "-m", "shadowpod.local.criu_restore"]
        command += ["--images", str(directory), "--criu", self.criu]
        command += ["--bind", f"{home / 'identity'}:{meta['identity_dir']}"]
        command += ["--termination-log", str(termination_log)]
        with (home / "restore.log").open("ab") as sink:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        instance = LocalInstance(spec, host, process, home / "agent.log", tag, inventory)
        instance.reaping = asyncio.create_task(self._reap(instance), name=f"reap-{spec.name}")
        self._instances[spec.name] = instance

    async def discard(self, checkpoint: str) -> None:
        shutil.rmtree(checkpoint, ignore_errors=True)

    # --- internals --------------------------------------------------------------------

    async def _fork(self, instance: LocalInstance, output: Path) -> CheckpointReport:
        """Ask the agent for its stopped copy (see ``shadowpod.agent.checkpoint``)."""
        body = CheckpointRequest(output=str(output)).model_dump(mode="json")
        try:
            async with self.http.post(
                f"{instance.url}/v1/checkpoint", json=body, timeout=CHECKPOINT_TIMEOUT
            ) as response:
                text = await response.text()
                if response.status != 201:
                    raise RuntimeFailure(
                        f"instance {instance.spec.name!r} made no checkpoint "
                        f"(HTTP {response.status}): {text}"
                    )
                return CheckpointReport.model_validate_json(text)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RuntimeUnavailable(f"instance {instance.spec.name!r}: {exc}") from exc
        except ValidationError as exc:
            raise RuntimeFailure(f"not a checkpoint report: {exc}") from exc

    async def _dump(self, pid: int, directory: Path) -> None:
        process = await asyncio.create_subprocess_exec(
            self.criu,
            "dump",
            "-t",
            str(pid),
            "-D",
            str(directory),
            "--shell-job",
            "-o",
            "dump.log",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(process.communicate(), DUMP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuntimeFailure(f"criu dump of pid {pid} took over {DUMP_TIMEOUT_S:g}s") from None
        if process.returncode != 0:
            errors = _errors(directory / "dump.log") or err.decode(errors="replace").strip()
            raise RuntimeFailure(f"criu dump of pid {pid} failed: {errors}")


async def _stopped(pid: int) -> None:
    """Wait until ``pid`` (the agent's copy) has stopped itself, ready to be dumped."""
    deadline = time.monotonic() + STOPPED_WAIT_S
    gone = f"the checkpoint copy (pid {pid}) exited before its dump"
    while True:
        state = _state(pid)
        if state in ("T", "t"):
            return
        if state in (None, "Z"):
            raise RuntimeFailure(gone)
        if time.monotonic() > deadline:
            raise RuntimeFailure(f"the checkpoint copy (pid {pid}) did not stop in time")
        await asyncio.sleep(0.005)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()[0]


def _errors(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    # criu logs errors it then works around (no tun device, an rlimit): the last say why.
    return "; ".join(line.strip() for line in lines if "Error" in line)[-800:]
