"""The flags and environment variables the chart gives the operator and the gateway are
ones their commands accept (`shadowpod operator --help`, `shadowpod gateway --help`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chart.helm import RELEASE, Rendered

OPERATOR = f"{RELEASE}-shadowpod-operator"
GATEWAY = f"{RELEASE}-shadowpod-gateway"
CLI = Path(__file__).resolve().parents[2] / "operator" / "shadowpod" / "cli"


def help_text(command: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "shadowpod", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # A command the chart runs and the CLI lacks is the very break this file exists to
    # catch: it fails, never skips.
    assert result.returncode == 0, f"`shadowpod {command} --help` failed: {result.stderr}"
    return result.stdout


def flags(args: list[str]) -> set[str]:
    return {arg for arg in args if arg.startswith("--")}


def offered(text: str) -> set[str]:
    # click shows a boolean pair as `--criu / --no-criu`: both are found.
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", text))


def test_every_command_the_chart_runs_exists(everything_on: Rendered) -> None:
    """Each shadowpod container of the chart (every switch on) runs a command
    ``shadowpod`` has."""
    commands = {
        container["args"][0]
        for kind in ("Deployment", "DaemonSet")
        for workload in everything_on.all(kind)
        for container in workload["spec"]["template"]["spec"]["containers"]
        if container.get("args") and not container["args"][0].startswith("-")
    }
    assert {"gateway", "operator"} <= commands, commands
    for command in sorted(commands):
        help_text(command)


@pytest.mark.parametrize(("command", "deployment"), [("gateway", GATEWAY), ("operator", OPERATOR)])
def test_every_flag_the_chart_passes_is_accepted(
    everything_on: Rendered, defaults: Rendered, command: str, deployment: str
) -> None:
    text = help_text(command)
    used = flags(everything_on.container(deployment)["args"]) | flags(
        defaults.container(deployment)["args"]
    )
    assert used - offered(text) == set(), f"`shadowpod {command}` does not accept these"


@pytest.mark.parametrize(("command", "deployment"), [("gateway", GATEWAY), ("operator", OPERATOR)])
def test_every_environment_variable_the_chart_sets_is_read(
    defaults: Rendered, command: str, deployment: str
) -> None:
    help_text(command)  # fails where the command is not in this build
    names = {item["name"] for item in defaults.container(deployment)["env"]}
    # click lists an option's environment variable in --help only with show_envvar; the
    # commands' source names it either way.
    source = "\n".join(path.read_text() for path in CLI.glob("*.py"))
    missing = {name for name in names if f'"{name}"' not in source}
    assert missing == set(), f"`shadowpod {command}` reads none of these"
