"""The Docker CLI, as the image tests use it: build the images, run hardened containers.

Every container runs as a pod of the Helm chart would: read-only root filesystem, the
numeric non-root user, every capability dropped, no privilege escalation, a writable
``/tmp`` (an emptyDir there), and — Docker's networks being unusable here — the host's
network, on a loopback address of its own.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[2]
USER: Final = "65532"
HARDENED: Final = (
    "--read-only",
    f"--user={USER}",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--network=host",
    "--tmpfs=/tmp:rw,nosuid,nodev,size=64m,mode=1777",
)
LABEL: Final = "dev.shadowpod.image-test"  # on every container a test starts


def owner_value() -> str:
    """A label value naming this test process: its pid namespace and pid (whether it
    is gone can only be told from the same pid namespace)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        namespace = "unknown"
    return f"{namespace}.{os.getpid()}"


def orphaned(value: str) -> bool:
    """Whether ``value`` (``owner_value()``'s, maybe with more after a dot) names a
    test process of this pid namespace that is gone: its containers are left over."""
    parts = value.split(".")
    if len(parts) < 2 or not parts[1].isdigit() or parts[0] != owner_value().split(".")[0]:
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def labelled(label: str) -> dict[str, str]:
    """{container name: its ``label``'s value} of every container that has it."""
    out = await docker(
        "ps", "--all", "--filter", f"label={label}", "--format", "{{json .}}", timeout_s=30
    )
    found = {}
    for line in out.splitlines():
        entry = json.loads(line)
        labels = dict(
            part.split("=", 1) for part in entry.get("Labels", "").split(",") if "=" in part
        )
        found[entry["Names"]] = labels.get(label, "")
    return found


async def remove_orphans(label: str) -> list[str]:
    """Remove the containers with ``label`` that a killed test process left; their names."""
    orphans = sorted(name for name, value in (await labelled(label)).items() if orphaned(value))
    for name in orphans:
        await docker("rm", "--force", "--volumes", name, check=False, timeout_s=60)
    return orphans


class DockerError(RuntimeError):
    pass


@functools.cache
def docker_unavailable() -> str | None:
    """Why containers cannot run here, or ``None`` when a Docker daemon answers."""
    if shutil.which("docker") is None:
        return "no docker command here (apt-get install docker.io)"
    try:
        answer = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "no Docker daemon answers: `docker info` hung for 30 s"
    if answer.returncode != 0:
        first = (answer.stderr.strip().splitlines() or ["no answer"])[0]
        return f"no Docker daemon answers (`docker info`: {first}); `hack/dockerd start` starts one"
    return None


async def docker(*args: str, check: bool = True, timeout_s: float = 120.0) -> str:
    """Run ``docker ARGS``; its stdout. A failure raises with what Docker said."""
    process = await asyncio.create_subprocess_exec(
        "docker",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise DockerError(f"docker {' '.join(args[:2])} did not finish in {timeout_s} s") from None
    if check and process.returncode != 0:
        raise DockerError(f"docker {' '.join(args)}: exit {process.returncode}: {err.decode()}")
    return out.decode()


@dataclass(frozen=True)
class Images:
    """What ``hack/image-build`` built: references by role."""

    shadowpod: str
    refagent: Mapping[int, str]  # version -> reference

    def all(self) -> list[str]:
        return [self.shadowpod, *self.refagent.values()]


def build_images(log: Path) -> Images:
    """Build the images as ``make image`` does; the build's output goes to ``log``."""
    with log.open("w") as output:
        built = subprocess.run(
            [str(REPO / "hack" / "image-build")],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=output,
            text=True,
            timeout=1500,
            check=False,
        )
    if built.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise DockerError(f"hack/image-build failed (exit {built.returncode}):\n{tail}")
    refs = dict(line.split(" ", 1) for line in built.stdout.splitlines() if " " in line)
    return Images(
        shadowpod=refs["shadowpod"],
        refagent={1: refs["refagent-v1"], 2: refs["refagent-v2"]},
    )


async def inspect_image(ref: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(await docker("image", "inspect", ref))
    return found[0]


@dataclass
class Container:
    """One container a test started (``docker run -d``); removed by ``Containers``."""

    id: str
    name: str

    async def logs(self) -> str:
        """What it wrote to stdout and stderr, interleaved."""
        process = await asyncio.create_subprocess_exec(
            "docker",
            "logs",
            self.name,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate()
        return out.decode(errors="replace")

    async def exit_code(self) -> int | None:
        """``None`` while it runs."""
        state = json.loads(await docker("inspect", "--format", "{{json .State}}", self.name))
        return None if state["Running"] else int(state["ExitCode"])

    async def stop(self, grace_s: int = 20) -> int:
        """SIGTERM, then SIGKILL after ``grace_s`` (a pod's termination); its exit code."""
        await docker("stop", f"--time={grace_s}", self.name, timeout_s=grace_s + 30)
        code = await self.exit_code()
        assert code is not None
        return code

    async def wait(self, timeout_s: float = 60.0) -> int:
        out = await docker("wait", self.name, timeout_s=timeout_s)
        return int(out.strip())


@dataclass
class Containers:
    """Starts hardened containers and removes every one of them at the end."""

    started: list[Container] = field(default_factory=list)

    async def run(
        self,
        image: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        mounts: Mapping[Path, str] | None = None,
        writable: Mapping[Path, str] | None = None,
        entrypoint: str | None = None,
    ) -> Container:
        """``mounts``: host path -> container path, read-only; ``writable``: read-write."""
        name = f"shadowpod-test-{uuid.uuid4().hex[:10]}"
        options = [*HARDENED, f"--name={name}", f"--label={LABEL}={owner_value()}"]
        for key, value in (env or {}).items():
            options.append(f"--env={key}={value}")
        for source, target in (mounts or {}).items():
            options.append(f"--volume={source}:{target}:ro")
        for source, target in (writable or {}).items():
            options.append(f"--volume={source}:{target}:rw")
        if entrypoint is not None:
            options.append(f"--entrypoint={entrypoint}")
        container_id = (await docker("run", "--detach", *options, image, *args)).strip()
        container = Container(container_id, name)
        self.started.append(container)
        return container

    async def run_to_end(
        self, image: str, args: Sequence[str] = (), *, entrypoint: str | None = None
    ) -> tuple[int, str]:
        """Run a container until it exits: its exit code and its output."""
        container = await self.run(image, args, entrypoint=entrypoint)
        code = await container.wait()
        return code, await container.logs()

    async def remove_all(self) -> dict[str, str]:
        """Remove every container started; the logs of each, by name."""
        logs = {}
        for container in self.started:
            logs[container.name] = await container.logs()
            await docker("rm", "--force", "--volumes", container.name, check=False)
        self.started.clear()
        return logs
