"""How a ``shadowpod`` command ends on an error a user can fix: one line on stderr that
says what is wrong and what to do, and an exit code — never a traceback. Each command
documents its exit codes (``--help``; docs/cli.md).
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import click


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` as one line (drivers' multi-line messages folded) and exit."""
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(code)


def interrupted() -> NoReturn:
    """Ctrl-C: the run's clean-up has stopped what it started; exit 130 as the signal
    would (not 1, which says a check failed)."""
    click.echo("interrupted: every process it started was stopped", err=True)
    sys.exit(128 + signal.SIGINT)


def writable_workdir(workdir: Path, option: str = "--workdir") -> None:
    """Exit 2 unless this user can write in ``workdir``: found before anything starts,
    rather than as a failure whose logs would have been written there."""
    try:
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as exc:
        fail(
            f"cannot write in {option} {workdir} ({exc.strerror or exc}): choose a directory "
            "this user may write in, or fix its permissions",
            2,
        )
