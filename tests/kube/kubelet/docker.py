"""The kubelet's container mode: each container of a pod is a Docker container of its
image, hardened as a pod of the Helm chart is.

- the image is the container's ``image``, as Docker has it (``--pull never``: nothing
  is pulled; a missing image is ``ErrImageNeverPull``, as a kubelet says);
- the host's network, so the container listens on its pod's 127.x.y.z address, which
  the kubelet gives it in ``status.podIP`` as in process mode;
- the pod's environment (values, Secret and ConfigMap keys, downward-API fields) on top
  of the image's; ``command`` replaces the image's entrypoint, ``args`` its command;
- each volume's files (written by ``containers.write_volumes``) bind-mounted at the
  volume mount's path: Secret, ConfigMap, downward-API and projected volumes read-only,
  as on a node; an ``emptyDir`` writable; the termination log a writable file;
- ``--read-only`` root with a tmpfs ``/tmp``, the numeric user 65532, no capability,
  no privilege escalation (``tests.image.docker.HARDENED``).

Every container carries the label ``dev.shadowpod.kubelet`` (this kubelet's own value,
which names the test process): the kubelet removes its containers when a pod goes and
all of them when it stops, and one started later removes those a killed test process
left behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from tests.image.docker import (
    HARDENED,
    USER,
    DockerError,
    docker,
    labelled,
    owner_value,
    remove_orphans,
)
from tests.kube.kubelet.containers import NotReadyToStart, expand

LABEL: Final = "dev.shadowpod.kubelet"
# Volumes a node mounts read-only whatever the pod says.
READ_ONLY_SOURCES: Final = ("secret", "configMap", "downwardAPI", "projected")


class DockerContainers:
    """How the kubelet runs containers in Docker; one per kubelet."""

    def __init__(self) -> None:
        self.owner = f"{owner_value()}.{uuid.uuid4().hex[:8]}"  # this test process's

    # --- before a container starts --------------------------------------------------------

    async def check_image(self, image: str) -> None:
        """Raises ``NotReadyToStart`` unless Docker has ``image`` (nothing is pulled)."""
        try:
            await docker("image", "inspect", "--format", "{{.Id}}", image, timeout_s=30)
        except DockerError:
            raise NotReadyToStart(
                "ErrImageNeverPull",
                f'Container image "{image}" is not present with pull policy of Never',
            ) from None

    @staticmethod
    def share(paths: Sequence[Path]) -> None:
        """Make the pod's files usable by the container's user, as a volume's ownership
        is on a node (root here can give them to the user; anyone else opens them up)."""
        for root in paths:
            for item in [root, *root.rglob("*")]:
                if os.geteuid() == 0:
                    os.chown(item, int(USER), int(USER))
                else:
                    item.chmod(0o777 if item.is_dir() else 0o666)

    @staticmethod
    def volume_options(
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        volumes: Mapping[str, Path],
        termination_log: Path,
    ) -> list[str]:
        """``--volume`` options: the container's volume mounts and its termination log."""
        always_read_only = {
            volume["name"]
            for volume in (pod.get("spec") or {}).get("volumes") or []
            if any(source in volume for source in READ_ONLY_SOURCES)
        }
        path = container.get("terminationMessagePath", "/dev/termination-log")
        options = [f"--volume={termination_log}:{path}:rw"]
        for mount in container.get("volumeMounts") or []:
            source = volumes.get(mount["name"])
            if source is None:
                raise NotReadyToStart(
                    "CreateContainerConfigError",
                    f"volume {mount['name']!r} is not in the pod's volumes",
                )
            here = source / mount["subPath"] if mount.get("subPath") else source
            read_only = mount.get("readOnly", False) or mount["name"] in always_read_only
            options.append(f"--volume={here}:{mount['mountPath']}:{'ro' if read_only else 'rw'}")
        return options

    @staticmethod
    def command_options(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
        """``[--entrypoint=X, IMAGE, args…]``: ``command`` replaces the image's
        entrypoint (and its command), ``args`` alone replace its command."""
        command = [expand(str(part), env) for part in container.get("command") or []]
        args = [expand(str(part), env) for part in container.get("args") or []]
        entry = [f"--entrypoint={command[0]}"] if command else []
        return [*entry, container["image"], *command[1:], *args]

    def create_args(
        self,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        env: Mapping[str, str],
        volumes: list[str],
    ) -> list[str]:
        """``docker create`` options and image, but for the name (one per start)."""
        meta = pod["metadata"]
        labels = {
            LABEL: self.owner,
            "io.kubernetes.pod.namespace": meta["namespace"],
            "io.kubernetes.pod.name": meta["name"],
            "io.kubernetes.pod.uid": meta["uid"],
            "io.kubernetes.container.name": container["name"],
        }
        options = [*HARDENED, "--pull=never"]
        options += [f"--label={key}={value}" for key, value in labels.items()]
        options += [f"--env={key}={value}" for key, value in env.items()]
        options += volumes
        return [*options, *self.command_options(container, env)]

    # --- a container's life --------------------------------------------------------------

    @staticmethod
    def name(pod: Mapping[str, Any], container: str, attempt: int) -> str:
        """As dockershim named them: k8s_CONTAINER_POD_NAMESPACE_UID_ATTEMPT."""
        meta = pod["metadata"]
        raw = f"k8s_{container}_{meta['name']}_{meta['namespace']}_{meta['uid'][:8]}_{attempt}"
        return re.sub(r"[^a-zA-Z0-9_.-]", "-", raw)

    async def create(self, name: str, create_args: Sequence[str]) -> None:
        await docker("create", f"--name={name}", *create_args, timeout_s=60)

    @staticmethod
    def start_attached() -> list[str]:
        """The command whose process stands for the container: it streams the
        container's output and exits with its exit code."""
        return ["docker", "start", "--attach"]

    async def signal(self, name: str, signal_name: str) -> None:
        await docker("kill", f"--signal={signal_name}", name, check=False, timeout_s=30)

    async def remove(self, name: str) -> None:
        """Killed if it runs, and removed."""
        await docker("rm", "--force", "--volumes", name, check=False, timeout_s=60)

    @staticmethod
    def exec_args(name: str) -> list[str]:
        return ["docker", "exec", name]

    # --- all of this kubelet's containers --------------------------------------------------

    async def listed(self) -> list[str]:
        """The names of this kubelet's containers."""
        return sorted(await labelled(f"{LABEL}={self.owner}"))

    async def remove_all(self) -> list[str]:
        """Remove every container of this kubelet; their names."""
        names = await self.listed()
        await asyncio.gather(*(self.remove(name) for name in names))
        return names

    @staticmethod
    async def remove_orphans() -> list[str]:
        """Remove the containers of kubelets whose test process is gone; their names."""
        return await remove_orphans(LABEL)
