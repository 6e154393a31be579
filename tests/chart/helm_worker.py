"""A process running real Helm (helm-sdkpy) for the chart's tests: JSON requests on
stdin, one per line, JSON answers on stdout.

Why a process of its own: Helm's release storage is chosen by ``HELM_DRIVER``, which
Helm's Go runtime reads from the environment the process *started* with (a library
loaded later sees ``putenv`` no more). The tests need the memory driver — the default
Secret driver speaks protobuf, which the emulated API server does not — so they start
this worker with it set. It also keeps a Go runtime out of pytest's process.

    python -m tests.chart.helm_worker KUBECONFIG NAMESPACE
    {"action": "install", "release": "sp", "chart": "charts/shadowpod", "values": {}}
    {"action": "lint", "release": "", "chart": "charts/shadowpod"}
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import helm_sdkpy  # type: ignore[import-untyped]


async def handle(config: Any, request: dict[str, Any]) -> dict[str, Any]:
    action, release = request["action"], request["release"]
    if action == "install":
        result: dict[str, Any] = await helm_sdkpy.Install(config).run(
            release, request["chart"], values=request["values"], wait=False, timeout=30
        )
        return result
    if action == "upgrade":
        result = await helm_sdkpy.Upgrade(config).run(
            release, request["chart"], values=request["values"], wait=False, timeout=30
        )
        return result
    if action == "lint":
        result = await helm_sdkpy.Lint(config).run(request["chart"])
        return result
    if action == "uninstall":
        result = await helm_sdkpy.Uninstall(config).run(release, wait=False, timeout=30)
        return result
    raise ValueError(f"unknown action {action!r}")


def main() -> None:
    kubeconfig, namespace = sys.argv[1], sys.argv[2]
    config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    for line in sys.stdin:
        answer: dict[str, Any]
        try:
            request = json.loads(line)
            result = asyncio.run(handle(config, request))
            if request["action"] != "lint":
                # What the tests read: the chart itself (its files, base64) would be most.
                result = {key: result.get(key) for key in ("info", "manifest", "hooks")}
            answer = {"result": result}
        except helm_sdkpy.HelmError as exc:
            answer = {"error": str(exc), "type": type(exc).__name__}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
