"""The ``shadowpod`` command group: quick to answer --help, and quiet on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest

from shadowpod.cli.main import COMMANDS, cli
from tests.conftest import default_sigint


def test_help_imports_none_of_the_commands() -> None:
    """`shadowpod --help` answered without importing the operator, the benchmarks, the
    gateway: imports were 3.7 s of it."""
    probe = (
        "import sys\n"
        "from shadowpod.cli.main import main\n"
        "sys.argv = ['shadowpod', '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('shadowpod.')))\n"
        "print(sorted(m for m in ('aiohttp', 'kopf', 'pydantic', 'rich') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    lines = done.stdout.splitlines()
    assert "Commands:" in done.stdout
    assert lines[-2] == "['shadowpod.cli', 'shadowpod.cli.main']"
    assert lines[-1] == "[]"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_line_of_the_help_is_the_commands_own(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    assert command.name == name
    assert COMMANDS[name][1] == command.get_short_help_str(limit=1000)


def test_ctrl_c_while_a_command_is_loaded_is_no_traceback(tmp_path: Path) -> None:
    """A real SIGINT, sent at the moment the benchmarks' package is imported (as a
    Ctrl-C during `shadowpod bench --help` on a slow machine lands)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'shadowpod.bench':\n"
        "            sys.meta_path.remove(self)\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "shadowpod", "bench", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
        preexec_fn=default_sigint,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "interrupted"
    assert done.returncode == 128 + signal.SIGINT
