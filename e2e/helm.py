"""``helm install`` / ``helm uninstall`` as the README writes them, carried out by real
Helm (helm-sdkpy: Helm's Go library, the chart tests' Helm) — there is no ``helm``
binary on these machines. The end-to-end suite runs the README's shell blocks with
``helm`` defined as ``python -m e2e.helm``, so the README's own line is what installs
the chart. Only the flags the README uses are understood; any other is refused, so the
README cannot drift into something this does not do.

    python -m e2e.helm install RELEASE CHART [-n NS] [--create-namespace] [--wait]
        [--timeout 300s] [--set key=value,...]
    python -m e2e.helm uninstall RELEASE [-n NS] [--wait]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any


def _value(text: str) -> Any:
    """What ``--set`` makes of a value: booleans, integers and null as Helm reads them."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    try:
        return int(text)
    except ValueError:
        return text


def values_from_sets(sets: list[str]) -> dict[str, Any]:
    """``--set a.b=1,c=x`` as nested values (no lists or escapes: the README needs none)."""
    values: dict[str, Any] = {}
    for item in sets:
        for pair in item.split(","):
            key, sep, raw = pair.partition("=")
            if not sep or not key:
                raise SystemExit(f"helm: --set {pair!r}: expected key=value")
            *parents, leaf = key.split(".")
            node = values
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = _value(raw)
    return values


def _seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="helm", exit_on_error=False)
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install")
    install.add_argument("release")
    install.add_argument("chart")
    uninstall = sub.add_parser("uninstall")
    uninstall.add_argument("release")
    for command in (install, uninstall):
        command.add_argument("-n", "--namespace", default="default")
        command.add_argument("--wait", action="store_true")
        command.add_argument("--timeout", default="300s")
    install.add_argument("--create-namespace", action="store_true")
    install.add_argument("--set", action="append", default=[])
    args = parser.parse_args(argv)

    import helm_sdkpy  # type: ignore[import-untyped]

    config = helm_sdkpy.Configuration(
        namespace=args.namespace, kubeconfig=os.environ.get("KUBECONFIG", "")
    )
    timeout = _seconds(args.timeout)
    if args.command == "install":
        result = asyncio.run(
            helm_sdkpy.Install(config).run(
                args.release,
                args.chart,
                values=values_from_sets(args.set),
                create_namespace=args.create_namespace,
                wait=args.wait,
                timeout=timeout,
            )
        )
        info = result.get("info") or {}
        print(f"NAME: {args.release}\nNAMESPACE: {args.namespace}")
        print(f"STATUS: {info.get('status', '?')}")
        notes = info.get("notes")
        if notes:
            print(f"NOTES:\n{notes}")
    else:
        asyncio.run(helm_sdkpy.Uninstall(config).run(args.release, wait=args.wait, timeout=timeout))
        print(f'release "{args.release}" uninstalled')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
