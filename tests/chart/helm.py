"""Real Helm (helm-sdkpy: Helm's Go library) installing the chart into the emulated API
server, and the manifests it rendered.

helm-sdkpy has no `helm template` and no dry-run, so the chart is installed for real
into ``tests/kube/emulator`` (``wait=False``: nothing runs the pods). Helm renders with
its own engine, checks ``values.schema.json``, applies every object through the API and
returns the manifest. Releases are kept in Helm's memory driver: its Secret driver
speaks protobuf, which the emulator does not.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

# The worker imports it; the tests skip, saying so, where it is missing.
HELM_MISSING = (
    None
    if importlib.util.find_spec("helm_sdkpy")
    else "helm-sdkpy is not installed: `make venv` installs it "
    "(pip install --ignore-requires-python helm-sdkpy==0.1.32)"
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "shadowpod"
RELEASE = "sp"
LINT_INFO = 1  # Helm's support.InfoSev
NAMESPACE = "shadowpod"


class HelmFailed(Exception):
    """Helm refused: the message is Helm's own (what a user of `helm install` reads)."""


@dataclass(frozen=True)
class Rendered:
    """What one install rendered: every object, in Helm's order, and its NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str
    manifest: str = ""  # as Helm rendered it, every template's output in its order

    def kinds(self) -> list[str]:
        return sorted(obj["kind"] for obj in self.objects)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [obj for obj in self.all(kind) if obj["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} found in {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        return [f"{obj['kind']}/{obj['metadata']['name']}" for obj in self.objects]

    def container(self, deployment: str) -> dict[str, Any]:
        containers = self.one("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        container: dict[str, Any] = containers[0]
        return container

    def pod_specs(self) -> Iterator[dict[str, Any]]:
        for deployment in self.all("Deployment"):
            yield deployment["spec"]["template"]["spec"]


def parse_manifest(manifest: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


class Helm:
    """Real Helm on one API server, releases in namespace ``shadowpod`` (see
    ``helm_worker``: one worker process, which keeps the releases in memory)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, kubeconfig: Path, namespace: str = NAMESPACE) -> Helm:
        if HELM_MISSING:
            pytest.skip(HELM_MISSING)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.chart.helm_worker",
            str(kubeconfig),
            namespace,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "HELM_DRIVER": "memory"},
            limit=16 * 1024 * 1024,
        )
        return cls(process)

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()

    async def _call(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout=60)
        assert line, "the Helm worker exited (see its stderr above)"
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise HelmFailed(answer["error"])
        result: dict[str, Any] = answer["result"]
        return result

    async def install(
        self, values: dict[str, Any] | None = None, chart: Path = CHART, release: str = RELEASE
    ) -> Rendered:
        return self._rendered(
            await self._call(
                action="install", release=release, chart=str(chart), values=values or {}
            )
        )

    async def upgrade(
        self, values: dict[str, Any] | None = None, chart: Path = CHART, release: str = RELEASE
    ) -> Rendered:
        return self._rendered(
            await self._call(
                action="upgrade", release=release, chart=str(chart), values=values or {}
            )
        )

    async def lint(self, chart: Path = CHART) -> list[dict[str, Any]]:
        """`helm lint`'s messages above INFO (Severity 2 warning, 3 error), as
        (severity, path, error) dicts."""
        result = await self._call(action="lint", release="", chart=str(chart))
        return [
            {"severity": m["Severity"], "path": m["Path"], "error": m["Err"]}
            for m in result.get("Messages") or []
            if m["Severity"] > LINT_INFO
        ]

    async def uninstall(self, release: str = RELEASE) -> None:
        await self._call(action="uninstall", release=release)

    @staticmethod
    def _rendered(result: dict[str, Any]) -> Rendered:
        assert (result.get("info") or {}).get("status") == "deployed", result.get("info")
        return Rendered(
            objects=parse_manifest(result["manifest"]),
            notes=result["info"].get("notes", ""),
            manifest=result["manifest"],
        )
