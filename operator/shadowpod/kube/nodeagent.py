"""The node agent: the kubelet's checkpoint archives on its node, made checkpoint images.

One per node (the chart's ``nodeAgent``, a DaemonSet, off by default), as root, with
the kubelet's checkpoint directory mounted. Every sweep, each archive of an agent
container (``checkpoint-<pod>_<ns>-agent-<time>.tar``) that has stopped growing is

1. made root-only (0600) at once, whatever mode the runtime gave it;
2. turned into a checkpoint OCI image with buildah — the archive's contents on an
   empty image, annotated ``io.kubernetes.cri-o.annotations.checkpoint.name=agent``,
   the form CRI-O restores a container from;
3. pushed to the configured registry as ``names.checkpoint_image(registry, archive)``
   (the name the operator gave the shadow pod: the pod waits in image pull until
   then), and the local copy removed;
4. deleted: it holds every memory page of the agent, its secrets too.

An archive that cannot be imaged after ``attempts`` sweeps is deleted as well, saying
why (the migration that asked for it rolls back or falls back on its own). Archives
of other containers are left alone: they are someone else's (forensic checkpoints).
buildah keeps its storage in ``storage_dir``, mode 0700.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shadowpod.kube import names

logger = logging.getLogger("shadowpod.node_agent")
KUBELET_CHECKPOINTS: Final = Path("/var/lib/kubelet/checkpoints")
# The time the kubelet puts in an archive's name (RFC 3339).
_STAMP: Final = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})"


class ImageBuildFailed(Exception):
    pass


@dataclass(frozen=True)
class NodeAgentConfig:
    registry: str
    storage_dir: Path
    checkpoints_dir: Path = KUBELET_CHECKPOINTS
    containers: tuple[str, ...] = (names.AGENT_CONTAINER,)
    tls_verify: bool = True
    authfile: Path | None = None
    settle_s: float = 2.0  # unchanged this long: the runtime has finished writing it
    interval_s: float = 2.0
    attempts: int = 3
    push_retries: int = 3  # buildah's own retries of one push, 2 s apart
    buildah: str = "buildah"


@dataclass
class _Seen:
    size: int
    since: float
    failures: int = 0


@dataclass
class NodeAgent:
    config: NodeAgentConfig
    _seen: dict[Path, _Seen] = field(default_factory=dict)

    def container_of(self, archive: Path) -> str | None:
        """The container ``archive`` is a checkpoint of, if it is one of ours."""
        for container in self.config.containers:
            pattern = rf"^checkpoint-[^_/]+_[^/]+-{re.escape(container)}-{_STAMP}\.tar$"
            if re.match(pattern, archive.name):
                return container
        return None

    async def run(self, stop: asyncio.Event) -> None:
        self.config.storage_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.config.storage_dir, 0o700)
        while not stop.is_set():
            await self.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.interval_s)

    async def sweep(self, *, now: float | None = None) -> list[str]:
        """Image every settled archive of ours; the images pushed."""
        now = time.monotonic() if now is None else now
        pushed = []
        present = set()
        for archive in sorted(self.config.checkpoints_dir.glob("checkpoint-*.tar")):
            container = self.container_of(archive)
            if container is None:
                continue
            present.add(archive)
            try:
                os.chmod(archive, 0o600)
                size = archive.stat().st_size
            except FileNotFoundError:
                continue
            seen = self._seen.get(archive)
            if seen is None or seen.size != size:
                self._seen[archive] = _Seen(size, now, 0 if seen is None else seen.failures)
                if self.config.settle_s > 0:
                    continue
                seen = self._seen[archive]
            if now - seen.since < self.config.settle_s:
                continue
            image = names.checkpoint_image(self.config.registry, str(archive))
            try:
                await self.build_and_push(archive, container, image)
            except ImageBuildFailed as exc:
                seen.failures += 1
                logger.warning("checkpoint %s not imaged (%s)", archive.name, exc)
                if seen.failures < self.config.attempts:
                    continue
                logger.error(
                    "checkpoint %s deleted unimaged after %d attempts",
                    archive.name,
                    seen.failures,
                )
            else:
                pushed.append(image)
                logger.info("checkpoint %s pushed as %s", archive.name, image)
            archive.unlink(missing_ok=True)
            self._seen.pop(archive, None)
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return pushed

    async def build_and_push(self, archive: Path, container: str, image: str) -> None:
        """The archive's contents on an empty image, annotated for CRI-O; pushed."""
        working = f"shadowpod-checkpoint-{uuid.uuid4().hex[:12]}"
        await self._buildah("from", "--name", working, "scratch")
        try:
            await self._buildah("add", working, str(archive), "/")
            annotation = f"{names.CHECKPOINT_IMAGE_ANNOTATION}={container}"
            await self._buildah("config", "--annotation", annotation, working)
            await self._buildah("commit", "--quiet", working, image)
        finally:
            await self._buildah("rm", working, check=False)
        push = [
            "push",
            "--quiet",
            f"--tls-verify={str(self.config.tls_verify).lower()}",
            f"--retry={self.config.push_retries}",
        ]
        if self.config.authfile is not None:
            push += ["--authfile", str(self.config.authfile)]
        try:
            await self._buildah(*push, image, f"docker://{image}")
        finally:
            await self._buildah("rmi", image, check=False)

    async def _buildah(self, *args: str, check: bool = True) -> str:
        storage = self.config.storage_dir
        argv = [
            self.config.buildah,
            "--root",
            str(storage / "root"),
            "--runroot",
            str(storage / "run"),
            "--storage-driver",
            "vfs",
            *args,
        ]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "BUILDAH_ISOLATION": "chroot"},
            )
        except OSError as exc:
            raise ImageBuildFailed(f"cannot run {self.config.buildah}: {exc}") from exc
        out, err = await process.communicate()
        if check and process.returncode != 0:
            said = err.decode(errors="replace").strip().splitlines()[-1:] or ["(nothing)"]
            raise ImageBuildFailed(f"buildah {args[0]} exited {process.returncode}: {said[0]}")
        return out.decode(errors="replace").strip()
