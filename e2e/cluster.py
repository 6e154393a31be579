"""A kind cluster for the end-to-end suite: created, loaded with the images, and
dumped (`kubectl get all -A`, describes, logs) when a test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("E2E_CLUSTER", "shadowpod-e2e")
VERSION = "0.1.0"
IMAGES = ("shadowpod:" + VERSION, "shadowpod-refagent:v1", "shadowpod-refagent:v2")


def missing_tools() -> str | None:
    """Why the suite cannot run here, or None."""
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not on the PATH: the e2e suite needs docker, kind and kubectl"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return "no Docker daemon answers (`hack/dockerd start` starts one)"
    return None


def run(*args: str, check: bool = True, timeout: float = 600, input: str | None = None) -> str:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False, input=input
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result.stdout


@dataclass
class Kind:
    kubeconfig: Path

    @classmethod
    def create(cls, directory: Path) -> Kind:
        kubeconfig = directory / "kubeconfig"
        existing = run("kind", "get", "clusters").split()
        if CLUSTER not in existing:
            run(
                "kind",
                "create",
                "cluster",
                "--name",
                CLUSTER,
                "--config",
                str(REPO / "e2e" / "kind-config.yaml"),
                "--wait",
                "180s",
            )
        kubeconfig.write_text(run("kind", "get", "kubeconfig", "--name", CLUSTER))
        return cls(kubeconfig)

    def load_images(self) -> None:
        run("make", "-C", str(REPO), "image", timeout=1800)
        for image in IMAGES:
            run("kind", "load", "docker-image", image, "--name", CLUSTER)

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 300, input: str | None = None
    ) -> str:
        return run(
            "kubectl",
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
                "get", "all,agentsessions,agentmigrations", "-A", "-o", "wide", check=False
            )
        ]
        parts.append(
            self.kubectl("describe", "agentsessions,agentmigrations,pods", "-A", check=False)
        )
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

    def delete(self) -> None:
        if not os.environ.get("E2E_KEEP"):
            run("kind", "delete", "cluster", "--name", CLUSTER, check=False)
