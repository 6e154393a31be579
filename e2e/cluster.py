"""The cluster the end-to-end suite runs on, and what to read when a test failed.

By default the cluster `make cluster` starts on this machine (hack/cluster: a real
control plane and two containerd nodes, the images imported); ``E2E_CLUSTER=kind``
takes a kind cluster instead, where kind's node image can be had; and
``E2E_KUBECONFIG`` names any cluster that already has the images.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KIND_CLUSTER = "shadowpod-e2e"
VERSION = "0.1.0"
IMAGES = ("shadowpod:" + VERSION, "shadowpod-refagent:v1", "shadowpod-refagent:v2")


def run(
    *args: str,
    check: bool = True,
    timeout: float = 600,
    input: str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    result = subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=input,
        env=env,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result.stdout


@dataclass
class Cluster:
    """A cluster reached with ``kubeconfig``, by the ``kubectl`` in ``bin_dir`` (or on
    the PATH), whose nodes are ``nodes``."""

    kubeconfig: Path
    bin_dir: Path | None = None
    nodes: list[str] = field(default_factory=list)

    @property
    def kubectl_path(self) -> str:
        if self.bin_dir is not None:
            return str(self.bin_dir / "kubectl")
        return shutil.which("kubectl") or "kubectl"

    def env(self) -> dict[str, str]:
        """The environment a user of this cluster has: KUBECONFIG, kubectl on the PATH,
        and this checkout's ``.venv/bin`` (``shadowpod``, ``kubectl-shadowpod``)."""
        path = [str(REPO / ".venv" / "bin")]
        if self.bin_dir is not None:
            path.append(str(self.bin_dir))
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": os.pathsep.join([*path, os.environ.get("PATH", "")]),
        }

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 300, input: str | None = None
    ) -> str:
        return run(
            self.kubectl_path,
            "--kubeconfig",
            str(self.kubeconfig),
            *args,
            check=check,
            timeout=timeout,
            input=input,
        )

    def dump(self) -> str:
        """What to read when a test failed."""
        parts = [
            self.kubectl(
                "get",
                "nodes,all,agentsessions,agentmigrations,pdb,networkpolicies",
                "-A",
                "-o",
                "wide",
                check=False,
            )
        ]
        parts.append(
            self.kubectl("describe", "agentsessions,agentmigrations,pods", "-A", check=False)
        )
        parts.append(self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False))
        pods = self.kubectl(
            "get",
            "pods",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{'\\n'}{end}",
            check=False,
        )
        for line in pods.split():
            namespace, name = line.split("/", 1)
            logs = self.kubectl(
                "logs", "-n", namespace, name, "--all-containers", "--tail=200", check=False
            )
            parts.append(f"--- logs {line}\n{logs}")
        return "\n".join(parts)


LOCAL_KUBECONFIG = Path("/var/lib/shadowpod-cluster/admin.kubeconfig")


def local_cluster() -> Cluster:
    """`make cluster`'s cluster (hack/cluster): its kubeconfig and the kubectl it built.
    The README's own `make cluster` line starts it."""
    bin_dir = run("bash", "-c", f". {REPO}/hack/cluster/lib.sh && echo $BIN").strip()
    return Cluster(LOCAL_KUBECONFIG, Path(bin_dir), ["node-1", "node-2"])


def missing_kind_tools() -> str | None:
    """Why a kind cluster cannot be made here, or None."""
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not on the PATH: E2E_CLUSTER=kind needs docker, kind and kubectl"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return "no Docker daemon answers (`hack/dockerd start` starts one)"
    return None


def kind_cluster(directory: Path) -> Cluster:
    """A three-node kind cluster (e2e/kind-config.yaml) with the images loaded."""
    kubeconfig = directory / "kubeconfig"
    if KIND_CLUSTER not in run("kind", "get", "clusters").split():
        run(
            "kind",
            "create",
            "cluster",
            "--name",
            KIND_CLUSTER,
            "--config",
            str(REPO / "e2e" / "kind-config.yaml"),
            "--wait",
            "180s",
        )
    kubeconfig.write_text(run("kind", "get", "kubeconfig", "--name", KIND_CLUSTER))
    for image in IMAGES:
        run("kind", "load", "docker-image", image, "--name", KIND_CLUSTER)
    cluster = Cluster(kubeconfig)
    cluster.nodes = cluster.kubectl("get", "nodes", "-o", "name").replace("node/", "").split()
    return cluster


def delete_kind_cluster() -> None:
    if not os.environ.get("E2E_KEEP"):
        run("kind", "delete", "cluster", "--name", KIND_CLUSTER, check=False)
