"""The chart as Helm renders it, for a user to look at: `make chart-render`.

    make chart-render VALUES=my-values.yaml > manifests.yaml
    .venv/bin/python -m tests.chart.render -f a.yaml -f b.yaml [--namespace NS] [--release R]

helm-sdkpy (Helm's Go library, what the chart's tests use) has no ``helm template``, so
this is what the tests do: a real ``helm install`` of charts/shadowpod into an
API-server emulator of its own (``tests.kube.emulator``: nothing runs, nothing leaves
this machine), with the values files merged as Helm merges ``-f`` files, and the
manifest Helm rendered printed on stdout — the same objects, in Helm's order, that a
``helm install`` with those values would apply. The namespaces the values name
(``operator.watchNamespaces``, ``networkPolicy.agentNamespaces``) are made first, as
they would exist on a cluster. NOTES.txt goes to stderr.

Exit: 0 rendered; 1 Helm refused the values (its message, one line: a schema error, a
``fail`` of the chart); 2 it cannot run (a values file missing or not YAML, helm-sdkpy
not installed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import kmock
import yaml
from kubernetes_asyncio import client

from tests.chart.helm import CHART, HELM_MISSING, Helm, HelmFailed
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator

MONITORING_CRDS = Path(__file__).parent / "crds"


def merged(files: Iterable[Path]) -> dict[str, Any]:
    """Values files merged as Helm merges ``-f`` files: maps key by key, a later file's
    other values (lists too) replacing an earlier one's."""

    def merge(into: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
        for key, value in update.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value
        return into

    values: dict[str, Any] = {}
    for path in files:
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} is not a map of values")
        merge(values, loaded)
    return values


def namespaces(values: dict[str, Any], release_namespace: str) -> list[str]:
    operator = values.get("operator") or {}
    network = values.get("networkPolicy") or {}
    named = [release_namespace]
    for name in [*(operator.get("watchNamespaces") or []), *(network.get("agentNamespaces") or [])]:
        if name not in named:
            named.append(str(name))
    return named


@contextlib.asynccontextmanager
async def cluster(directory: Path, names: list[str]) -> AsyncIterator[KubeConnection]:
    async with ApiServerEmulator(crds=[MONITORING_CRDS]) as server, kmock.Server(server):
        connection = KubeConnection.to_emulator(str(server.url).rstrip("/"), directory)
        async with connection.api() as api:
            core = client.CoreV1Api(api)
            for name in names:
                await core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
                )
        yield connection


async def render(
    values: dict[str, Any], *, namespace: str, release: str, chart: Path = CHART
) -> tuple[str, str]:
    """The manifest Helm rendered and its NOTES.txt."""
    with tempfile.TemporaryDirectory(prefix="shadowpod-chart-render-") as directory:
        async with cluster(Path(directory), namespaces(values, namespace)) as connection:
            helm = await Helm.start(connection.kubeconfig, namespace)
            try:
                rendered = await helm.install(values, chart=chart, release=release)
            finally:
                await helm.close()
    return rendered.manifest, rendered.notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make chart-render", description="Print the chart's manifests as Helm renders them."
    )
    parser.add_argument(
        "-f", "--values", type=Path, action="append", default=[], help="A values file (repeat)."
    )
    parser.add_argument("--namespace", default="shadowpod-system", help="The release's namespace.")
    parser.add_argument("--release", default="shadowpod", help="The release's name.")
    args = parser.parse_args(argv)
    if HELM_MISSING:
        print(f"error: {HELM_MISSING}", file=sys.stderr)
        return 2
    try:
        values = merged(args.values)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"error: cannot read the values: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
    try:
        manifest, notes = asyncio.run(
            render(values, namespace=args.namespace, release=args.release)
        )
    except HelmFailed as exc:
        print(f"error: helm refused the values: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    sys.stdout.write(manifest if manifest.endswith("\n") else manifest + "\n")
    if notes:
        print(notes, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
